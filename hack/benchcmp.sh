#!/usr/bin/env bash
# Side-by-side benchmark of two revisions on a shared, noisy machine: builds the test
# binary of PKG at OLD (a git revision) and at the working tree, then runs them in
# turn ROUNDS times (old, new, old, new, …) so load and drift hit both alike, and
# prints benchstat's comparison. Usage:
#   hack/benchcmp.sh OLD PKG BENCH [ROUNDS] [extra test flags...]
# e.g. hack/benchcmp.sh c3f7117 ./internal/seen/ 'ObserveRedelivered$' 6 -test.benchtime=1s
# The state files of benchmarks that write one go to $TMPDIR (a real disk unless you
# point it at tmpfs).
set -euo pipefail
old=$1 pkg=$2 bench=$3 rounds=${4:-6}
shift $(( $# < 4 ? $# : 4 ))
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
trap 'git -C "$root" worktree remove --force "$work/old" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
echo "==> building $pkg at $old and at the working tree" >&2
git -C "$root" worktree add --detach -q "$work/old" "$old"
(cd "$work/old" && go test -c -o "$work/old.test" "$pkg")
(cd "$root" && go test -c -o "$work/new.test" "$pkg")
pkgdir="${pkg%/}"; pkgdir="${pkgdir#./}"
for i in $(seq "$rounds"); do
	echo "==> round $i/$rounds" >&2
	(cd "$work/old/$pkgdir" && "$work/old.test" -test.run '^$' -test.bench "$bench" -test.benchmem -test.count 1 "$@") >>"$work/old.txt"
	(cd "$root/$pkgdir" && "$work/new.test" -test.run '^$' -test.bench "$bench" -test.benchmem -test.count 1 "$@") >>"$work/new.txt"
done
go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da old="$work/old.txt" new="$work/new.txt"
