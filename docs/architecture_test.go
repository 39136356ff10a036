// Package docs holds the tests that keep the documents beside it true to the code.
package docs

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// repoRoot is the checkout this test was compiled from.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// goTree is what the repository's non-test Go files declare: a name the
// documents give must be there, not only in a test.
type goTree struct {
	pkgs      map[string]map[string]bool // package name → its top-level names
	members   map[string]map[string]bool // type name (any package) → methods, fields, interface methods
	files     map[string]map[string]bool // file path (slash, from the root) → top-level names, Recv.Method and Method
	externals map[string]bool            // names under which packages outside the module are imported
}

func parseTree(t *testing.T, root string) *goTree {
	t.Helper()
	tree := &goTree{pkgs: map[string]map[string]bool{}, members: map[string]map[string]bool{},
		files: map[string]map[string]bool{}, externals: map[string]bool{}}
	add := func(m map[string]map[string]bool, k, v string) {
		if m[k] == nil {
			m[k] = map[string]bool{}
		}
		m[k][v] = true
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if tree.files[rel] == nil {
			tree.files[rel] = map[string]bool{} // a file of no declarations (doc.go) is there too
		}
		pkg := f.Name.Name
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(p, "github.com/npagent/npagent") {
				continue
			}
			n := p[strings.LastIndex(p, "/")+1:]
			if imp.Name != nil {
				n = imp.Name.Name
			}
			tree.externals[n] = true
		}
		top := func(n string) {
			add(tree.pkgs, pkg, n)
			add(tree.files, rel, n)
		}
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if decl.Recv == nil {
					top(decl.Name.Name)
					continue
				}
				recv := recvName(decl.Recv.List[0].Type)
				add(tree.members, recv, decl.Name.Name)
				add(tree.files, rel, recv+"."+decl.Name.Name)
				add(tree.files, rel, decl.Name.Name) // file.go:method, as the documents write it too
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					switch spec := spec.(type) {
					case *ast.TypeSpec:
						top(spec.Name.Name)
						if tree.members[spec.Name.Name] == nil {
							tree.members[spec.Name.Name] = map[string]bool{}
						}
						for _, m := range typeMembers(spec.Type) {
							add(tree.members, spec.Name.Name, m)
						}
					case *ast.ValueSpec:
						for _, n := range spec.Names {
							top(n.Name)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("parse the repository's Go files: %v", err)
	}
	return tree
}

// recvName is a method receiver's type name, without pointer or type parameters.
func recvName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// typeMembers are a struct's fields (embedded ones by type name) or an
// interface's methods and embedded interfaces.
func typeMembers(e ast.Expr) []string {
	var fields *ast.FieldList
	switch x := e.(type) {
	case *ast.StructType:
		fields = x.Fields
	case *ast.InterfaceType:
		fields = x.Methods
	default:
		return nil
	}
	var out []string
	for _, f := range fields.List {
		for _, n := range f.Names {
			out = append(out, n.Name)
		}
		if len(f.Names) == 0 {
			if sel, ok := f.Type.(*ast.SelectorExpr); ok {
				out = append(out, sel.Sel.Name)
			} else if n := recvName(f.Type); n != "" {
				out = append(out, n)
			}
		}
	}
	return out
}

// goName is a backticked Go name as the documents write one: an optional file
// (`sync.go:` or `seen/set.go:`), then dotted identifiers, then optional arguments.
var goName = regexp.MustCompile(`^(?:([A-Za-z0-9_./-]+\.go):)?([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?:\(.*\))?$`)

// filesNamed are the tree's Go files whose path is file or ends with /file.
func (tree *goTree) filesNamed(file string) []string {
	var files []string
	for f := range tree.files {
		if f == file || strings.HasSuffix(f, "/"+file) {
			files = append(files, f)
		}
	}
	slices.Sort(files)
	return files
}

// check says why name (the part after any file) is not in the tree, or "" when it
// is or when it is not a Go name the tree could hold (a metric, a span name, a
// field path, a bare word).
func (tree *goTree) check(file, name string) string {
	if strings.HasSuffix(name, ".go") && file == "" { // a file by itself: `sync.go`
		if len(tree.filesNamed(name)) == 0 {
			return "no Go file " + name + " in the tree (outside tests)"
		}
		return ""
	}
	segs := strings.Split(name, ".")
	if file != "" {
		files := tree.filesNamed(file)
		if len(files) == 0 {
			return "no Go file " + file + " in the tree (outside tests)"
		}
		for _, f := range files {
			if tree.files[f][name] {
				return ""
			}
		}
		return name + " is not declared in " + strings.Join(files, ", ") + " (outside tests)"
	}
	if len(segs) < 2 {
		// A bare identifier in camel case (`mergePodPolicy`, `ExplainPod`) is
		// declared somewhere; a lowercase word (`sync`, `stale`) or a constant's
		// SHOUTING_CASE is too ambiguous to judge.
		if !camelCase(name) || tree.declared(name) {
			return ""
		}
		return "nothing in the tree declares " + name + " (outside tests)"
	}
	x, y := segs[0], segs[1]
	switch {
	case tree.pkgs[x] != nil && x != "main":
		if !tree.pkgs[x][y] {
			return "package " + x + " declares no " + y + " (outside tests)"
		}
		if len(segs) > 2 && !tree.members[y][segs[2]] {
			return y + " has no method or field " + segs[2] + " (outside tests)"
		}
	case tree.members[x] != nil:
		if !tree.members[x][y] {
			return "type " + x + " has no method or field " + y + " (outside tests)"
		}
	case tree.externals[x]:
	case strings.ContainsFunc(x, unicode.IsUpper): // a type's name (`Set`, `podTable`), not a path or a metric
		return "no package or type " + x + " in the tree (outside tests)"
	}
	return ""
}

// camelCase reports whether name mixes upper and lower case without underscores.
func camelCase(name string) bool {
	return strings.ContainsFunc(name, unicode.IsUpper) && strings.ContainsFunc(name, unicode.IsLower) && !strings.Contains(name, "_")
}

// declared reports whether any package declares name at top level, or any type
// has it as a method or field.
func (tree *goTree) declared(name string) bool {
	for _, names := range tree.pkgs {
		if names[name] {
			return true
		}
	}
	for _, names := range tree.members {
		if names[name] {
			return true
		}
	}
	return false
}

// TestArchitectureNamesExist fails when docs/ARCHITECTURE.md names, in backticks, a
// Go function, type, method or field (`pkg.Func`, `Type.Method`, `file.go:Func`, a
// camel-case `mergePodPolicy`) or a Go file that the repository's non-test Go files
// do not declare: the document describes the code as it is, and code that moved or
// went must take its description along. Names it cannot judge pass: lowercase words,
// metric and span names, external packages' names; a Kubernetes field is written
// with its parent (`spec.podIsolation`), so that it is not taken for Go.
func TestArchitectureNamesExist(t *testing.T) {
	root := repoRoot()
	tree := parseTree(t, root)
	const doc = "docs/ARCHITECTURE.md"
	f, err := os.Open(filepath.Join(root, doc))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ticks := regexp.MustCompile("`([^`]+)`")
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		for _, m := range ticks.FindAllStringSubmatch(sc.Text(), -1) {
			g := goName.FindStringSubmatch(m[1])
			if g == nil {
				continue
			}
			if why := tree.check(g[1], g[2]); why != "" {
				t.Errorf("%s:%d names `%s`: %s\n\t%s", doc, n, m[1], why, strings.TrimSpace(sc.Text()))
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}
