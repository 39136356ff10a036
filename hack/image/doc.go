// Command image builds npagent's container image from Go source, with no
// container daemon: go-containerregistry assembles the layers, configs, manifests
// and the index that a daemon's build would, from the static binaries that
// go build makes.
//
//	go run ./hack/image -version v1.2.3 -revision <commit> -created <unix seconds> -out bin/image
//
// `make image` runs it with the Makefile's VERSION and LDFLAGS, the commit and the
// commit's time (SOURCE_DATE_EPOCH). It writes:
//
//   - <out>/oci: an OCI image layout holding one image index for linux/amd64 and
//     linux/arm64 (index.json names it org.opencontainers.image.ref.name=<version>),
//     for skopeo, crane, regctl or oras to push: `skopeo copy --all
//     oci:bin/image/oci:<version> docker://registry/npagent:<version>`;
//   - <out>/npagent-<version>-<arch>.tar: one docker-archive per platform, tagged
//     npagent:<version>, for `docker load`, `ctr images import` or
//     `kind load image-archive`, which take a single platform.
//
// What it promises:
//
//   - each image is one layer holding only /usr/local/bin/npagent (CGO_ENABLED=0,
//     -trimpath, the given -ldflags) and its parent directories: no shell, no libc,
//     no package manager;
//   - the entrypoint is the binary; the user is 0:0 (root), on purpose — see
//     docs/how-to/build-image.md: the pod drops every capability but the ones the
//     eBPF dataplane needs, which Kubernetes grants reliably only to uid 0;
//   - labels org.opencontainers.image.{title,version,source,revision,created};
//   - reproducible: every timestamp (files, config, history) is -created, the
//     commit's time, and tar and gzip output is deterministic, so the same source,
//     flags and Go toolchain give the same digests.
package main
