package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"sigs.k8s.io/yaml"
)

// mdLink is an inline Markdown link or image: [text](target) or [text](target "title").
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// markdownFiles are the documents whose links TestRelativeLinksResolve checks: the
// README, CONTRIBUTING.md and everything under docs/.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md", "CONTRIBUTING.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, _ := filepath.Rel(root, path)
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// proseLines are a document's lines outside fenced code blocks, numbered from 1.
func proseLines(text string) map[int]string {
	out := map[int]string{}
	fenced := false
	for i, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out[i+1] = line
		}
	}
	return out
}

// anchors are the heading anchors GitHub gives a document: lower case, spaces as
// hyphens, punctuation but hyphens and underscores dropped; a repeated heading
// gets -1, -2, ...
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range proseLines(text) {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

func itoa(n int) string {
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}

// TestRelativeLinksResolve fails when a relative link in README.md,
// CONTRIBUTING.md or docs/ names a file that is not in the checkout, or an anchor
// that the linked Markdown document (or the document itself) has no heading for:
// a moved or renamed page takes its links along.
func TestRelativeLinksResolve(t *testing.T) {
	root := repoRoot()
	for _, doc := range markdownFiles(t, root) {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range proseLines(string(b)) {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				file := filepath.Join(root, filepath.Dir(doc), filepath.FromSlash(path))
				if path == "" {
					file = filepath.Join(root, doc)
				}
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s:%d: link %q: no %s in the checkout", doc, n, target, path)
					continue
				}
				if anchor == "" || !strings.HasSuffix(file, ".md") {
					continue
				}
				linked, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				if !anchors(string(linked))[anchor] {
					t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", doc, n, target, path, anchor)
				}
			}
		}
	}
}

// runbookBase is where the alerts' runbook_url points: this repository's pages.
const runbookBase = "https://github.com/npagent/npagent/blob/main/"

// TestEveryAlertHasARunbook fails when an alert of deploy/prometheus has no
// runbook_url, or one that is not a section of a page in this checkout: whoever is
// paged lands on what to do.
func TestEveryAlertHasARunbook(t *testing.T) {
	root := repoRoot()
	b, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "npagent.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `json:"alert"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			url := r.Annotations["runbook_url"]
			path, ok := strings.CutPrefix(url, runbookBase)
			page, anchor, _ := strings.Cut(path, "#")
			if !ok || anchor == "" {
				t.Errorf("alert %s: runbook_url %q, want %s<page>#<section>", r.Alert, url, runbookBase)
				continue
			}
			text, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(page)))
			if err != nil {
				t.Errorf("alert %s: runbook_url %q: %v", r.Alert, url, err)
				continue
			}
			if !anchors(string(text))[anchor] {
				t.Errorf("alert %s: runbook_url %q: %s has no section #%s", r.Alert, url, page, anchor)
			}
		}
	}
	if alerts == 0 {
		t.Fatal("no alert in deploy/prometheus/npagent.rules.yaml")
	}
}
