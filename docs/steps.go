package docs

import (
	"regexp"
	"strings"
)

// Step is one command of a page's sh block, as a reader would paste it.
type Step struct {
	Line int // 1-based line of its first line in the page
	// Cmd is the command on one line: continuation lines joined, a trailing
	// comment dropped, a here-document's body left out.
	Cmd string
	// Script is the step's literal text, continuation lines and here-document
	// (body and terminator) included: what a shell runs.
	Script string
}

var (
	heredocStart = regexp.MustCompile(`<<-?'?(\w+)'?$`)
	catHeredoc   = regexp.MustCompile(`^cat > (\S+) <<'?(\w+)'?$`)
)

// ShellSteps are a page's sh (or bash) blocks, as steps, and the files their
// here-documents write (cat > file <<'EOF' … EOF), by file name.
func ShellSteps(text string) (steps []Step, files map[string]string) {
	files = map[string]string{}
	lines := strings.Split(text, "\n")
	inSh := false
	for i := 0; i < len(lines); i++ {
		t := strings.TrimSpace(lines[i])
		switch {
		case !inSh && (t == "```sh" || t == "```bash"):
			inSh = true
			continue
		case inSh && t == "```":
			inSh = false
			continue
		case !inSh:
			continue
		}
		start := i
		cmd := t
		for strings.HasSuffix(cmd, `\`) && i+1 < len(lines) {
			i++
			cmd = strings.TrimSuffix(cmd, `\`) + " " + strings.TrimSpace(lines[i])
		}
		if c, _, ok := strings.Cut(cmd, " #"); ok {
			cmd = c
		}
		cmd = strings.TrimSpace(cmd)
		if m := heredocStart.FindStringSubmatch(cmd); m != nil {
			var body []string
			for i++; i < len(lines) && strings.TrimSpace(lines[i]) != m[1]; i++ {
				body = append(body, lines[i])
			}
			if f := catHeredoc.FindStringSubmatch(cmd); f != nil {
				files[f[1]] = strings.Join(body, "\n")
			}
		}
		if cmd != "" && !strings.HasPrefix(cmd, "#") {
			end := min(i+1, len(lines))
			steps = append(steps, Step{Line: start + 1, Cmd: cmd, Script: strings.Join(lines[start:end], "\n")})
		}
	}
	return steps, files
}
