package v1alpha1_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/npagent/npagent/internal/testenv"
)

// projectAdditions are the schema differences npagent's CRDs may have from the
// controller's, by schema path, each with the reason it is safe. Empty: npagent's types
// match the controller's. A path listed here that no longer differs fails the test, so
// the list cannot go stale.
var projectAdditions = map[string]map[string]string{
	testenv.UpstreamPolicyEndpointCRD:        {},
	testenv.UpstreamClusterPolicyEndpointCRD: {},
}

// TestCRDSchemasMatchTheController compares npagent's generated CRDs (config/crd) with
// the AWS Network Policy Controller's, keyword by keyword through every level of
// openAPIV3Schema, and the CRD fields that decide how objects are served. Any
// difference would make one of the two prune, reject or default what the other keeps:
// npagent's CRDs applied over the controller's would drop fields it writes, or tests
// against npagent's CRDs would accept objects the controller's reject. Descriptions
// may differ.
func TestCRDSchemasMatchTheController(t *testing.T) {
	upstream := testenv.UpstreamCRDDir(t)
	for file, allowed := range projectAdditions {
		t.Run(file, func(t *testing.T) {
			ours := readCRD(t, filepath.Join(testenv.CRDDir(), file))
			theirs := readCRD(t, filepath.Join(upstream, file))
			used := map[string]bool{}
			for _, d := range crdDiffs(ours, theirs) {
				if reason, ok := allowed[d.path]; ok {
					used[d.path] = true
					t.Logf("allowed: %s: %s (%s)", d.path, d.msg, reason)
					continue
				}
				t.Errorf("%s: %s", d.path, d.msg)
			}
			for path := range allowed {
				if !used[path] {
					t.Errorf("projectAdditions lists %s, which no longer differs: remove it", path)
				}
			}
		})
	}
}

// TestCRDDiffsFindsDifferences shows the comparison is not vacuous: each kind of
// difference that changes what the apiserver keeps, rejects or defaults is reported,
// at its path, and a description is not.
func TestCRDDiffsFindsDifferences(t *testing.T) {
	base := readCRD(t, filepath.Join(testenv.CRDDir(), testenv.UpstreamPolicyEndpointCRD))
	props := func(c *apiextensionsv1.CustomResourceDefinition) map[string]apiextensionsv1.JSONSchemaProps {
		return c.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties
	}
	// rule returns a copy of the CRD whose spec.ingress items schema is changed by f.
	rule := func(f func(s *apiextensionsv1.JSONSchemaProps)) *apiextensionsv1.CustomResourceDefinition {
		c := base.DeepCopy()
		spec := props(c)["spec"]
		ingress := spec.Properties["ingress"]
		f(ingress.Items.Schema)
		spec.Properties["ingress"] = ingress
		props(c)["spec"] = spec
		return c
	}
	port := func(f func(s *apiextensionsv1.JSONSchemaProps)) func(s *apiextensionsv1.JSONSchemaProps) {
		return func(s *apiextensionsv1.JSONSchemaProps) {
			ports := s.Properties["ports"]
			p := ports.Items.Schema.Properties["protocol"]
			f(&p)
			ports.Items.Schema.Properties["protocol"] = p
			s.Properties["ports"] = ports
		}
	}
	for _, tc := range []struct {
		name, path string
		changed    *apiextensionsv1.CustomResourceDefinition
	}{
		{"property removed (prunes)", "spec.ingress[].domainName", rule(func(s *apiextensionsv1.JSONSchemaProps) { delete(s.Properties, "domainName") })},
		{"required added (rejects)", "spec.ingress[]", rule(func(s *apiextensionsv1.JSONSchemaProps) { s.Required = []string{"cidr"} })},
		{"enum added (rejects)", "spec.ingress[].ports[].protocol", rule(port(func(s *apiextensionsv1.JSONSchemaProps) {
			s.Enum = []apiextensionsv1.JSON{{Raw: []byte(`"TCP"`)}}
		}))},
		{"default dropped", "spec.ingress[].ports[].protocol", rule(port(func(s *apiextensionsv1.JSONSchemaProps) { s.Default = nil }))},
		{"pattern changed", "spec.ingress[].domainName", rule(func(s *apiextensionsv1.JSONSchemaProps) {
			d := s.Properties["domainName"]
			d.Pattern = "^[a-z.]+$"
			s.Properties["domainName"] = d
		})},
		{"type changed", "spec.ingress[].cidr", rule(func(s *apiextensionsv1.JSONSchemaProps) {
			d := s.Properties["cidr"]
			d.Type = "integer"
			s.Properties["cidr"] = d
		})},
		{"other keyword", "spec.ingress[]", rule(func(s *apiextensionsv1.JSONSchemaProps) { s.MaxProperties = new(int64) })},
		{"short name", "spec.names.shortNames", func() *apiextensionsv1.CustomResourceDefinition {
			c := base.DeepCopy()
			c.Spec.Names.ShortNames = []string{"pe"}
			return c
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			diffs := crdDiffs(tc.changed, base)
			if len(diffs) != 1 || diffs[0].path != tc.path {
				t.Errorf("diffs = %v, want one at %s", diffs, tc.path)
			}
		})
	}
	descr := rule(func(s *apiextensionsv1.JSONSchemaProps) { s.Description = "changed" })
	if diffs := crdDiffs(descr, base); len(diffs) != 0 {
		t.Errorf("a description change is reported: %v", diffs)
	}
}

func readCRD(t *testing.T, path string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(raw, crd); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(crd.Spec.Versions) == 0 {
		t.Fatalf("%s: no versions", path)
	}
	return crd
}

type schemaDiff struct{ path, msg string }

func (d schemaDiff) String() string { return d.path + ": " + d.msg }

// crdDiffs returns the differences between two CRDs, ours against theirs, that change
// how the apiserver serves, prunes, validates or defaults objects.
func crdDiffs(ours, theirs *apiextensionsv1.CustomResourceDefinition) []schemaDiff {
	var out []schemaDiff
	add := func(path, format string, args ...any) {
		out = append(out, schemaDiff{path, fmt.Sprintf(format, args...)})
	}
	eq := func(path string, a, b any) {
		if !reflect.DeepEqual(a, b) {
			add(path, "ours %s, theirs %s", show(a), show(b))
		}
	}
	eq("metadata.name", ours.Name, theirs.Name)
	eq("spec.group", ours.Spec.Group, theirs.Spec.Group)
	eq("spec.scope", ours.Spec.Scope, theirs.Spec.Scope)
	eq("spec.names.kind", ours.Spec.Names.Kind, theirs.Spec.Names.Kind)
	eq("spec.names.listKind", ours.Spec.Names.ListKind, theirs.Spec.Names.ListKind)
	eq("spec.names.plural", ours.Spec.Names.Plural, theirs.Spec.Names.Plural)
	eq("spec.names.singular", ours.Spec.Names.Singular, theirs.Spec.Names.Singular)
	eq("spec.names.shortNames", ours.Spec.Names.ShortNames, theirs.Spec.Names.ShortNames)
	eq("spec.names.categories", ours.Spec.Names.Categories, theirs.Spec.Names.Categories)
	eq("spec.preserveUnknownFields", ours.Spec.PreserveUnknownFields, theirs.Spec.PreserveUnknownFields)
	eq("spec.conversion", ours.Spec.Conversion, theirs.Spec.Conversion)
	if len(ours.Spec.Versions) != len(theirs.Spec.Versions) {
		add("spec.versions", "ours %d versions, theirs %d", len(ours.Spec.Versions), len(theirs.Spec.Versions))
		return out
	}
	for i := range ours.Spec.Versions {
		o, th := ours.Spec.Versions[i], theirs.Spec.Versions[i]
		v := "spec.versions[" + o.Name + "]"
		eq(v+".name", o.Name, th.Name)
		eq(v+".served", o.Served, th.Served)
		eq(v+".storage", o.Storage, th.Storage)
		eq(v+".deprecated", o.Deprecated, th.Deprecated)
		eq(v+".subresources", o.Subresources, th.Subresources)
		eq(v+".additionalPrinterColumns", o.AdditionalPrinterColumns, th.AdditionalPrinterColumns)
		eq(v+".selectableFields", o.SelectableFields, th.SelectableFields)
		if o.Schema == nil || th.Schema == nil || o.Schema.OpenAPIV3Schema == nil || th.Schema.OpenAPIV3Schema == nil {
			eq(v+".schema", o.Schema != nil, th.Schema != nil)
			continue
		}
		out = append(out, schemaDiffs("", o.Schema.OpenAPIV3Schema, th.Schema.OpenAPIV3Schema)...)
	}
	return out
}

// schemaDiffs walks two schemas in step. path is the object path the schema applies to
// ("spec.ingress[].cidr"; "[]" for array items, ".*" for map values, "" for the root).
func schemaDiffs(path string, ours, theirs *apiextensionsv1.JSONSchemaProps) []schemaDiff {
	var out []schemaDiff
	at := path
	if at == "" {
		at = "(root)"
	}
	add := func(format string, args ...any) {
		out = append(out, schemaDiff{at, fmt.Sprintf(format, args...)})
	}
	eq := func(keyword string, a, b any) {
		if !reflect.DeepEqual(a, b) {
			add("%s: ours %s, theirs %s", keyword, show(a), show(b))
		}
	}
	eq("type", ours.Type, theirs.Type)
	eq("format", ours.Format, theirs.Format)
	eq("required", sorted(ours.Required), sorted(theirs.Required))
	eq("enum", enumSet(ours.Enum), enumSet(theirs.Enum))
	eq("default", jsonValue(ours.Default), jsonValue(theirs.Default))
	eq("minimum", ours.Minimum, theirs.Minimum)
	eq("maximum", ours.Maximum, theirs.Maximum)
	eq("exclusiveMinimum", ours.ExclusiveMinimum, theirs.ExclusiveMinimum)
	eq("exclusiveMaximum", ours.ExclusiveMaximum, theirs.ExclusiveMaximum)
	eq("pattern", ours.Pattern, theirs.Pattern)
	eq("nullable", ours.Nullable, theirs.Nullable)
	eq("x-kubernetes-preserve-unknown-fields", ours.XPreserveUnknownFields, theirs.XPreserveUnknownFields)
	eq("x-kubernetes-embedded-resource", ours.XEmbeddedResource, theirs.XEmbeddedResource)
	eq("x-kubernetes-int-or-string", ours.XIntOrString, theirs.XIntOrString)
	eq("x-kubernetes-list-type", ours.XListType, theirs.XListType)
	eq("x-kubernetes-list-map-keys", ours.XListMapKeys, theirs.XListMapKeys)
	eq("x-kubernetes-map-type", ours.XMapType, theirs.XMapType)
	eq("x-kubernetes-validations", ours.XValidations, theirs.XValidations)

	// Properties: a property only one side has is pruned by the other.
	names := map[string]bool{}
	for n := range ours.Properties {
		names[n] = true
	}
	for n := range theirs.Properties {
		names[n] = true
	}
	for _, n := range slices.Sorted(maps.Keys(names)) {
		child := n
		if path != "" {
			child = path + "." + n
		}
		o, oOK := ours.Properties[n]
		th, thOK := theirs.Properties[n]
		switch {
		case !thOK:
			out = append(out, schemaDiff{child, "only in ours: the controller's schema prunes it"})
		case !oOK:
			out = append(out, schemaDiff{child, "only in theirs: npagent's schema prunes it"})
		default:
			out = append(out, schemaDiffs(child, &o, &th)...)
		}
	}
	// Array items and map values.
	oi, ti := itemsSchema(ours.Items), itemsSchema(theirs.Items)
	switch {
	case oi != nil && ti != nil:
		out = append(out, schemaDiffs(path+"[]", oi, ti)...)
	case oi != nil || ti != nil:
		add("items: ours %v, theirs %v", oi != nil, ti != nil)
	}
	oa, ta := ours.AdditionalProperties, theirs.AdditionalProperties
	switch {
	case oa != nil && ta != nil && oa.Schema != nil && ta.Schema != nil:
		eq("additionalProperties.allows", oa.Allows, ta.Allows)
		out = append(out, schemaDiffs(path+".*", oa.Schema, ta.Schema)...)
	default:
		eq("additionalProperties", oa, ta)
	}

	// Every keyword not compared above (minItems, maxProperties, oneOf, …) is compared
	// whole, so a keyword this walker does not name cannot slip through.
	eq("other keywords", rest(ours), rest(theirs))
	return out
}

// rest clears what schemaDiffs compares one by one, and descriptions.
func rest(s *apiextensionsv1.JSONSchemaProps) apiextensionsv1.JSONSchemaProps {
	r := *s.DeepCopy()
	r.Description, r.Title, r.Example, r.ExternalDocs = "", "", nil, nil
	r.Type, r.Format, r.Required, r.Enum, r.Default = "", "", nil, nil, nil
	r.Minimum, r.Maximum, r.ExclusiveMinimum, r.ExclusiveMaximum = nil, nil, false, false
	r.Pattern, r.Nullable = "", false
	r.XPreserveUnknownFields, r.XEmbeddedResource, r.XIntOrString = nil, false, false
	r.XListType, r.XListMapKeys, r.XMapType, r.XValidations = nil, nil, nil, nil
	r.Properties, r.Items, r.AdditionalProperties = nil, nil, nil
	return r
}

func itemsSchema(i *apiextensionsv1.JSONSchemaPropsOrArray) *apiextensionsv1.JSONSchemaProps {
	if i == nil {
		return nil
	}
	if i.Schema == nil && len(i.JSONSchemas) > 0 {
		return &i.JSONSchemas[0]
	}
	return i.Schema
}

func sorted(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}

func enumSet(e []apiextensionsv1.JSON) []string {
	var out []string
	for _, v := range e {
		out = append(out, jsonValue(&v))
	}
	return sorted(out)
}

// jsonValue is a JSON value in canonical form, so formatting does not count.
func jsonValue(v *apiextensionsv1.JSON) string {
	if v == nil {
		return ""
	}
	var x any
	if err := json.Unmarshal(v.Raw, &x); err != nil {
		return string(v.Raw)
	}
	b, _ := json.Marshal(x)
	return string(b)
}

func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return strings.TrimSpace(string(b))
}
