package charts

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
)

// KubeVersion is the Kubernetes version charts are rendered for (.Capabilities): the
// version of k8s.io/client-go in go.mod, as a helm binary built with it would report.
const KubeVersion = "v1.37.2"

// Release names a release: the objects' names and namespace.
type Release struct {
	Name      string
	Namespace string
}

// Manifest is one rendered object, as helm template prints it.
type Manifest struct {
	Source  string // the template it came from, e.g. npagent/templates/rbac.yaml
	Kind    string
	Content string
}

// Rendered is a chart rendered for a release.
type Rendered struct {
	Manifests []Manifest // in Helm's install order
	Notes     string     // NOTES.txt
}

// String is what helm template prints: each manifest after "---" and its source.
func (r Rendered) String() string {
	var b strings.Builder
	for _, m := range r.Manifests {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", m.Source, m.Content)
	}
	return b.String()
}

// Dir is the directory of the chart named name in this repository.
func Dir(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), name)
}

// Render renders the chart at dir for rel with values over the chart's values.yaml,
// as helm template does: values validated against values.schema.json, templates
// rendered, NOTES.txt set apart, the rest sorted in install order. Hooks are an error:
// the charts have none, and helm template would print them apart.
func Render(dir string, rel Release, values map[string]any) (Rendered, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return Rendered{}, fmt.Errorf("load chart %s: %w", dir, err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	kv, err := chartutil.ParseKubeVersion(KubeVersion)
	if err != nil {
		return Rendered{}, err
	}
	caps.KubeVersion = *kv
	if ch.Metadata.KubeVersion != "" && !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, kv.String()) {
		return Rendered{}, fmt.Errorf("chart %s requires kubeVersion %s, rendering for %s", ch.Name(), ch.Metadata.KubeVersion, kv)
	}
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{
		Name: rel.Name, Namespace: rel.Namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return Rendered{}, fmt.Errorf("values: %w", err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return Rendered{}, fmt.Errorf("render: %w", err)
	}
	var out Rendered
	notes := filepath.ToSlash(filepath.Join(ch.Name(), "templates", "NOTES.txt"))
	for name, content := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			if name == notes {
				out.Notes = content
			}
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return Rendered{}, fmt.Errorf("sort manifests: %w", err)
	}
	if len(hooks) > 0 {
		return Rendered{}, fmt.Errorf("chart %s has hooks (%s): Render does not print them", ch.Name(), hooks[0].Path)
	}
	for _, m := range manifests {
		out.Manifests = append(out.Manifests, Manifest{Source: m.Name, Kind: m.Head.Kind, Content: m.Content})
	}
	return out, nil
}
