package charts

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
)

// A fake digest, the form image.digest takes.
var testDigest = "sha256:" + strings.Repeat("ab", 32)

// testCase is a set of values the chart is rendered with, for a release of its own.
type testCase struct {
	name   string
	rel    Release
	values map[string]any
}

// cases: the defaults, and every knob the chart has changed at once (TLS through a
// Secret, and through a ConfigMap with the namespace rendered).
var cases = []testCase{
	{"defaults", Release{"npagent", "npagent"}, nil},
	{"custom", Release{"custom", "custom-ns"}, map[string]any{
		"image":                 map[string]any{"repository": "registry.example.com/npagent", "digest": testDigest},
		"otlp":                  map[string]any{"endpoint": "https://collector.example.com:4317", "insecure": false, "caCert": map[string]any{"secretName": "otlp-ca", "key": "bundle.pem"}, "clusterName": "prod"},
		"resources":             map[string]any{"requests": map[string]any{"cpu": "100m", "memory": "128Mi"}, "limits": map[string]any{"memory": "512Mi"}},
		"goMemLimitPercent":     90,
		"extraArgs":             []any{"--workers=4", "--resync-period=5m"},
		"extraEnv":              []any{map[string]any{"name": "OTEL_SERVICE_NAME", "value": "npagent-prod"}},
		"dropFQDNAllowRules":    true,
		"podInterfacePrefixes":  []any{"eni", "vlan"},
		"nodeAddressInterfaces": []any{"veth*", "cilium_host"},
		"enforcingMode":         "strict",
		"nodeEgress":            "policy",
		"conntrackEntries":      8192,
		"verdictSeriesLimit":    500,
		"auditMode":             true,
		"flowEvents":            map[string]any{"mode": "all", "rate": 10, "burst": 20, "file": map[string]any{"enabled": true, "hostPath": "/var/log/np", "maxSizeMB": 5, "maxFiles": 2}},
		"metrics":               map[string]any{"port": 9555},
		"health":                map[string]any{"port": 9556},
		"serviceAccount":        map[string]any{"name": "agent"},
	}},
	{"configmap-ca-namespace", Release{"np", "np-system"}, map[string]any{
		"namespace":         map[string]any{"create": true},
		"image":             map[string]any{"tag": "v9.9.9"},
		"otlp":              map[string]any{"endpoint": "https://collector:4317", "insecure": false, "caCert": map[string]any{"configMapName": "otlp-ca"}},
		"resources":         map[string]any{"limits": map[string]any{"memory": "1G"}},
		"goMemLimitPercent": 50,
	}},
}

func render(t *testing.T, c testCase) Rendered {
	t.Helper()
	r, err := Render(Dir("npagent"), c.rel, c.values)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	return r
}

// objects decodes the rendered manifests.
func objects(t *testing.T, r Rendered) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, m := range r.Manifests {
		u := &unstructured.Unstructured{}
		if err := yaml.UnmarshalStrict([]byte(m.Content), &u.Object); err != nil {
			t.Fatalf("%s: %v\n%s", m.Source, err, m.Content)
		}
		objs = append(objs, u)
	}
	return objs
}

// typed converts the single object of kind in objs, rejecting unknown fields.
func typed[T any](t *testing.T, objs []*unstructured.Unstructured, kind string) *T {
	t.Helper()
	var found *T
	for _, o := range objs {
		if o.GetKind() != kind {
			continue
		}
		if found != nil {
			t.Fatalf("more than one %s", kind)
		}
		found = new(T)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, found, true); err != nil {
			t.Fatalf("%s %s: %v", kind, o.GetName(), err)
		}
	}
	if found == nil {
		t.Fatalf("no %s rendered", kind)
	}
	return found
}

// TestLint runs what helm lint runs (Chart.yaml, values and their schema, templates,
// deprecated APIs) with each case's values; warnings fail too (helm lint --strict).
func TestLint(t *testing.T) {
	kv, err := chartutil.ParseKubeVersion(KubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		l := lint.AllWithKubeVersion(Dir("npagent"), c.values, c.rel.Namespace, kv)
		for _, m := range l.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("%s: helm lint: %s", c.name, m)
			} else {
				t.Logf("%s: helm lint: %s", c.name, m)
			}
		}
	}
}

// TestChartHoldsNoCRD: the controller installs the CRDs; the chart must not replace them.
func TestChartHoldsNoCRD(t *testing.T) {
	for _, c := range cases {
		for _, o := range objects(t, render(t, c)) {
			if o.GetKind() == "CustomResourceDefinition" {
				t.Errorf("%s: the chart renders the CRD %s: the controller installs the CRDs", c.name, o.GetName())
			}
		}
	}
	if entries, err := os.ReadDir(filepath.Join(Dir("npagent"), "crds")); err == nil && len(entries) > 0 {
		t.Errorf("the chart has a crds/ directory: the controller installs the CRDs")
	}
	notes := render(t, cases[0]).Notes
	if !strings.Contains(notes, "CRDs are not in this chart") {
		t.Errorf("NOTES.txt does not say the CRDs are not in the chart:\n%s", notes)
	}
}

// TestAuditModeNotes: audit mode enforces nothing, and the install says so (only
// then).
func TestAuditModeNotes(t *testing.T) {
	if notes := render(t, cases[0]).Notes; strings.Contains(notes, "AUDIT MODE") {
		t.Errorf("NOTES.txt warns of audit mode with the defaults:\n%s", notes)
	}
	if notes := render(t, cases[1]).Notes; !strings.Contains(notes, "AUDIT MODE (auditMode: true). NO NETWORK POLICY IS ENFORCED") {
		t.Errorf("NOTES.txt does not warn that audit mode enforces nothing:\n%s", notes)
	}
}

// TestBadValuesFailTheRender: values that would run a broken or weaker agent are
// refused when rendering, naming the value.
func TestBadValuesFailTheRender(t *testing.T) {
	for _, tc := range []struct {
		name    string
		values  map[string]any
		wantErr string
	}{
		{"ca with insecure", map[string]any{"otlp": map[string]any{"endpoint": "https://c:4317", "caCert": map[string]any{"secretName": "ca"}}}, "insecure"},
		{"ca with http", map[string]any{"otlp": map[string]any{"insecure": false, "caCert": map[string]any{"secretName": "ca"}}}, "https://"},
		{"ca twice", map[string]any{"otlp": map[string]any{"endpoint": "https://c:4317", "insecure": false, "caCert": map[string]any{"secretName": "ca", "configMapName": "ca"}}}, "not both"},
		{"digest", map[string]any{"image": map[string]any{"digest": "sha256:xyz"}}, "digest"},
		{"percent 0", map[string]any{"goMemLimitPercent": 0}, "goMemLimitPercent"},
		{"percent 101", map[string]any{"goMemLimitPercent": 101}, "goMemLimitPercent"},
		{"fractional limit", map[string]any{"goMemLimitPercent": 90, "resources": map[string]any{"limits": map[string]any{"memory": "0.5Gi"}}}, "resources.limits.memory"},
		{"no limit", map[string]any{"goMemLimitPercent": 90, "resources": map[string]any{"limits": nil}}, "resources.limits.memory"},
		{"pod security", map[string]any{"namespace": map[string]any{"podSecurity": map[string]any{"enforce": "baseline"}}}, "privileged"},
		{"log level", map[string]any{"logLevel": "verbose"}, "logLevel"},
		{"interface prefix list", map[string]any{"podInterfacePrefixes": []any{"eni,vlan"}}, "podInterfacePrefixes"},
		{"node interface list", map[string]any{"nodeAddressInterfaces": []any{"veth*,eth1"}}, "nodeAddressInterfaces"},
		{"enforcing mode", map[string]any{"enforcingMode": "Strict"}, "enforcingMode"},
		// A misspelled key would otherwise be ignored, its default kept silently.
		{"misspelled key", map[string]any{"enforcingmode": "strict"}, "enforcingmode"},
		// The agent refuses an endpoint without a scheme; the chart says so at install.
		{"endpoint without scheme", map[string]any{"otlp": map[string]any{"endpoint": "otel-collector:4317"}}, "/otlp/endpoint"},
		{"misspelled nested key", map[string]any{"otlp": map[string]any{"endpont": "https://c:4317"}}, "endpont"},
		{"node egress", map[string]any{"nodeEgress": "deny"}, "nodeEgress"},
		{"probes on the metrics port", map[string]any{"health": map[string]any{"port": 9437}}, "health.port"},
	} {
		_, err := Render(Dir("npagent"), Release{"npagent", "npagent"}, tc.values)
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: err = %v, want one naming %q", tc.name, err, tc.wantErr)
		}
	}
}

// envByName returns the container's variable name, failing when it is missing.
func envByName(t *testing.T, c corev1.Container, name string) corev1.EnvVar {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			return e
		}
	}
	t.Fatalf("no %s in the container's environment", name)
	return corev1.EnvVar{}
}

func hasEnv(c corev1.Container, name string) bool {
	return slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
}

// TestDaemonSet checks the pod the chart runs, for every case: least privilege, the
// host paths, the downward API, probes, metrics address and GOMEMLIMIT.
func TestDaemonSet(t *testing.T) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ds := typed[appsv1.DaemonSet](t, objects(t, render(t, c)), "DaemonSet")
			pod := ds.Spec.Template.Spec
			if !pod.HostNetwork || pod.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
				t.Errorf("hostNetwork %v dnsPolicy %q, want the host network resolving cluster names", pod.HostNetwork, pod.DNSPolicy)
			}
			if len(pod.Tolerations) != 1 || pod.Tolerations[0].Operator != corev1.TolerationOpExists || pod.Tolerations[0].Key != "" || pod.Tolerations[0].Effect != "" {
				t.Errorf("tolerations %+v, want one that tolerates every taint", pod.Tolerations)
			}
			if pod.PriorityClassName != "system-node-critical" {
				t.Errorf("priorityClassName %q", pod.PriorityClassName)
			}
			if g := pod.TerminationGracePeriodSeconds; g == nil || *g != 30 {
				t.Errorf("terminationGracePeriodSeconds %v, want 30", g)
			}
			if u := ds.Spec.UpdateStrategy; u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil || u.RollingUpdate.MaxUnavailable == nil || u.RollingUpdate.MaxUnavailable.String() != "10%" {
				t.Errorf("updateStrategy %+v, want RollingUpdate with maxUnavailable 10%%", u)
			}
			if len(pod.Containers) != 1 || len(pod.InitContainers) != 0 {
				t.Fatalf("%d containers, %d init containers, want the agent alone", len(pod.Containers), len(pod.InitContainers))
			}
			ctr := pod.Containers[0]

			sc := ctr.SecurityContext
			if sc == nil || sc.Capabilities == nil {
				t.Fatal("no securityContext with capabilities")
			}
			if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
				t.Errorf("capabilities drop %v, want [ALL]", sc.Capabilities.Drop)
			}
			add := slices.Clone(sc.Capabilities.Add)
			slices.Sort(add)
			if !slices.Equal(add, []corev1.Capability{"BPF", "NET_ADMIN"}) {
				t.Errorf("capabilities add %v, want exactly BPF and NET_ADMIN (no SYS_ADMIN: bpffs is mounted by the host)", sc.Capabilities.Add)
			}
			if sc.Privileged == nil || *sc.Privileged {
				t.Errorf("privileged %v, want false", sc.Privileged)
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("allowPrivilegeEscalation %v, want false", sc.AllowPrivilegeEscalation)
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Errorf("readOnlyRootFilesystem %v, want true", sc.ReadOnlyRootFilesystem)
			}
			if sc.RunAsUser == nil || *sc.RunAsUser != 0 {
				t.Errorf("runAsUser %v, want 0 (the image runs as root; capabilities are not ambient)", sc.RunAsUser)
			}
			if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("seccompProfile %+v, want RuntimeDefault", sc.SeccompProfile)
			}
			if psc := pod.SecurityContext; psc != nil && psc.SeccompProfile != nil && psc.SeccompProfile.Type == corev1.SeccompProfileTypeUnconfined {
				t.Error("the pod's seccompProfile is Unconfined")
			}

			mounts := map[string]corev1.VolumeMount{}
			for _, m := range ctr.VolumeMounts {
				mounts[m.MountPath] = m
			}
			hostPaths := map[string]string{}
			for _, v := range pod.Volumes {
				if v.HostPath != nil {
					hostPaths[v.Name] = v.HostPath.Path
				}
			}
			bpf, ok := mounts["/sys/fs/bpf"]
			if !ok || hostPaths[bpf.Name] != "/sys/fs/bpf" {
				t.Errorf("/sys/fs/bpf is not the host's /sys/fs/bpf")
			} else if bpf.MountPropagation == nil || *bpf.MountPropagation != corev1.MountPropagationHostToContainer {
				t.Errorf("/sys/fs/bpf mountPropagation %v, want HostToContainer (never Bidirectional: the agent mounts nothing)", ptrString(bpf.MountPropagation))
			}
			if st, ok := mounts["/var/lib/npagent"]; !ok || hostPaths[st.Name] != "/var/lib/npagent" {
				t.Errorf("/var/lib/npagent is not the host's /var/lib/npagent")
			}
			// The debug socket's directory (default --debug-socket): init containers
			// running npagent wait reach the agent through the host's /run/npagent.
			if r, ok := mounts["/run/npagent"]; !ok || hostPaths[r.Name] != "/run/npagent" {
				t.Errorf("/run/npagent is not the host's /run/npagent")
			}
			// With flowEvents.file.enabled, also the flow log's directory.
			delete(hostPaths, "flowlog")
			if len(hostPaths) != 3 {
				t.Errorf("host paths %v, want /sys/fs/bpf, /var/lib/npagent and /run/npagent only (and the flow log's)", hostPaths)
			}
			if !slices.Contains(ctr.Args, "--state-file=/var/lib/npagent/seen.state") || !slices.Contains(ctr.Args, "--bpffs-path=/sys/fs/bpf/npagent") {
				t.Errorf("args %v: the state file and the pins are not on the host paths", ctr.Args)
			}

			if f := envByName(t, ctr, "NODE_NAME").ValueFrom; f == nil || f.FieldRef == nil || f.FieldRef.FieldPath != "spec.nodeName" {
				t.Errorf("NODE_NAME not from spec.nodeName: %+v", f)
			}
			if f := envByName(t, ctr, "NODE_IP").ValueFrom; f == nil || f.FieldRef == nil || f.FieldRef.FieldPath != "status.hostIP" {
				t.Errorf("NODE_IP not from status.hostIP: %+v", f)
			}
			var port int32
			for _, p := range ctr.Ports {
				if p.Name == "metrics" {
					port = p.ContainerPort
				}
			}
			if port == 0 {
				t.Fatal("no port named metrics")
			}
			if got, want := envByName(t, ctr, "NPAGENT_METRICS_ADDR").Value, fmt.Sprintf("$(NODE_IP):%d", port); got != want {
				t.Errorf("NPAGENT_METRICS_ADDR %q, want %q (the node IP, the metrics port)", got, want)
			}
			// NODE_IP must come before the variable that expands it.
			if i, j := slices.IndexFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "NODE_IP" }), slices.IndexFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "NPAGENT_METRICS_ADDR" }); i > j {
				t.Error("NODE_IP is defined after NPAGENT_METRICS_ADDR: $(NODE_IP) would not expand")
			}
			healthPort := 9438
			if h, ok := c.values["health"].(map[string]any); ok {
				healthPort = h["port"].(int)
			}
			if got, want := envByName(t, ctr, "NPAGENT_HEALTH_ADDR").Value, fmt.Sprintf("127.0.0.1:%d", healthPort); got != want {
				t.Errorf("NPAGENT_HEALTH_ADDR %q, want %q (loopback, the health port)", got, want)
			}
			for name, p := range map[string]*corev1.Probe{"startup": ctr.StartupProbe, "liveness": ctr.LivenessProbe, "readiness": ctr.ReadinessProbe} {
				want := "/livez"
				if name == "readiness" {
					want = "/readyz"
				}
				if p == nil || p.HTTPGet == nil {
					t.Errorf("no %s probe over HTTP", name)
					continue
				}
				// The probes' own listener on loopback, which pods cannot reach, not the
				// metrics port every pod can hold requests on.
				if p.HTTPGet.Path != want || p.HTTPGet.Host != "127.0.0.1" || p.HTTPGet.Port.String() != fmt.Sprint(healthPort) {
					t.Errorf("%s probe on %s %s:%s, want %s on 127.0.0.1:%d", name, p.HTTPGet.Path, p.HTTPGet.Host, p.HTTPGet.Port.String(), want, healthPort)
				}
			}

			limit := ctr.Resources.Limits.Memory()
			gml := envByName(t, ctr, "GOMEMLIMIT")
			pct, _ := c.values["goMemLimitPercent"].(int)
			if pct == 0 || pct == 100 {
				f := gml.ValueFrom
				if f == nil || f.ResourceFieldRef == nil || f.ResourceFieldRef.Resource != "limits.memory" || f.ResourceFieldRef.ContainerName != ctr.Name || !f.ResourceFieldRef.Divisor.Equal(resource.MustParse("1")) {
					t.Errorf("GOMEMLIMIT %+v, want the downward API's limits.memory of this container, divisor 1 (bytes)", gml)
				}
			} else if want := fmt.Sprint(limit.Value() * int64(pct) / 100); gml.Value != want {
				t.Errorf("GOMEMLIMIT %q, want %s (%d%% of %s)", gml.Value, want, pct, limit)
			}

			var wantImage string
			switch c.name {
			case "defaults":
				wantImage = "npagent:0.1.0"
				for _, a := range []string{"--enforcing-mode=standard", "--node-egress=allow", "--flow-events=deny", "--flow-events-rate=100", "--flow-events-burst=200"} {
					if !slices.Contains(ctr.Args, a) {
						t.Errorf("defaults: args %v, want %s", ctr.Args, a)
					}
				}
				for _, a := range ctr.Args {
					if strings.HasPrefix(a, "--flow-log-file") {
						t.Errorf("defaults: %s, want no flow log file", a)
					}
				}
				if hasEnv(ctr, "OTEL_EXPORTER_OTLP_CERTIFICATE") || envByName(t, ctr, "OTEL_EXPORTER_OTLP_INSECURE").Value != "true" {
					t.Error("defaults: want plaintext OTLP without a CA")
				}
				if limit.String() != "256Mi" {
					t.Errorf("defaults: memory limit %s, want 256Mi", limit)
				}
			case "custom":
				wantImage = "registry.example.com/npagent@" + testDigest
				for _, a := range []string{"--workers=4", "--resync-period=5m", "--drop-fqdn-allow-rules", "--pod-interface-prefixes=eni,vlan", "--node-address-interfaces=veth*,cilium_host", "--enforcing-mode=strict", "--node-egress=policy", "--conntrack-entries=8192", "--verdict-series-limit=500", "--audit-mode",
					"--flow-events=all", "--flow-events-rate=10", "--flow-events-burst=20", "--flow-log-file=/var/log/npagent/flows.log", "--flow-log-max-size=5", "--flow-log-max-files=2"} {
					if !slices.Contains(ctr.Args, a) {
						t.Errorf("args %v, want %s", ctr.Args, a)
					}
				}
				flowlog := false
				for _, v := range pod.Volumes {
					if v.Name == "flowlog" && v.HostPath != nil && v.HostPath.Path == "/var/log/np" {
						flowlog = true
					}
				}
				if !flowlog || !slices.ContainsFunc(ctr.VolumeMounts, func(m corev1.VolumeMount) bool {
					return m.Name == "flowlog" && m.MountPath == "/var/log/npagent" && !m.ReadOnly
				}) {
					t.Errorf("custom: no flow log hostPath /var/log/np mounted at /var/log/npagent: %+v %+v", pod.Volumes, ctr.VolumeMounts)
				}
				if envByName(t, ctr, "OTEL_SERVICE_NAME").Value != "npagent-prod" || envByName(t, ctr, "OTEL_RESOURCE_ATTRIBUTES").Value != "k8s.cluster.name=prod" {
					t.Error("custom: extraEnv or clusterName missing")
				}
				if ctr.Resources.Requests.Cpu().String() != "100m" || limit.String() != "512Mi" {
					t.Errorf("custom: resources %+v", ctr.Resources)
				}
				if pod.ServiceAccountName != "agent" {
					t.Errorf("serviceAccountName %q, want agent", pod.ServiceAccountName)
				}
				checkCA(t, pod, ctr, "bundle.pem", func(v corev1.Volume) string {
					if v.Secret == nil {
						return ""
					}
					return v.Secret.SecretName
				})
			case "configmap-ca-namespace":
				wantImage = "npagent:v9.9.9"
				checkCA(t, pod, ctr, "ca.crt", func(v corev1.Volume) string {
					if v.ConfigMap == nil {
						return ""
					}
					return v.ConfigMap.Name
				})
			}
			if ctr.Image != wantImage {
				t.Errorf("image %q, want %q", ctr.Image, wantImage)
			}
		})
	}
}

func ptrString[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// checkCA: OTLP over TLS with the CA mounted read-only from the named source.
func checkCA(t *testing.T, pod corev1.PodSpec, ctr corev1.Container, key string, source func(corev1.Volume) string) {
	t.Helper()
	if v := envByName(t, ctr, "OTEL_EXPORTER_OTLP_INSECURE").Value; v != "false" {
		t.Errorf("OTEL_EXPORTER_OTLP_INSECURE %q with a CA, want false", v)
	}
	path := envByName(t, ctr, "OTEL_EXPORTER_OTLP_CERTIFICATE").Value
	dir, file := filepath.Split(path)
	if file != key {
		t.Errorf("OTEL_EXPORTER_OTLP_CERTIFICATE %q, want a file named %s", path, key)
	}
	var mount *corev1.VolumeMount
	for i, m := range ctr.VolumeMounts {
		if m.MountPath == filepath.Clean(dir) {
			mount = &ctr.VolumeMounts[i]
		}
	}
	if mount == nil || !mount.ReadOnly {
		t.Fatalf("no read-only mount at %s", dir)
	}
	for _, v := range pod.Volumes {
		if v.Name == mount.Name && source(v) == "otlp-ca" {
			return
		}
	}
	t.Errorf("the volume %s is not otlp-ca from the expected source", mount.Name)
}

// TestCleanupValue: with cleanup set, every node's pod runs `npagent cleanup --wait`
// on the agent's own paths (its flow log file's too when on), with the agent's
// privileges and mounts and no probes of the agent's listeners (no agent runs);
// without it, the agent.
func TestCleanupValue(t *testing.T) {
	agent := typed[appsv1.DaemonSet](t, objects(t, render(t, cases[0])), "DaemonSet").Spec.Template.Spec.Containers[0]
	ds := typed[appsv1.DaemonSet](t, objects(t, render(t, testCase{"cleanup", Release{"npagent", "npagent"}, map[string]any{"cleanup": true}})), "DaemonSet")
	ctr := ds.Spec.Template.Spec.Containers[0]
	want := []string{"cleanup", "--bpffs-path=/sys/fs/bpf/npagent", "--state-file=/var/lib/npagent/seen.state", "--debug-socket=/run/npagent/debug.sock", "--wait"}
	if !slices.Equal(ctr.Args, want) {
		t.Errorf("args %q, want %q", ctr.Args, want)
	}
	for _, a := range agent.Args {
		if p, _, ok := strings.Cut(a, "="); ok && (p == "--bpffs-path" || p == "--state-file") && !slices.Contains(want, a) {
			t.Errorf("the agent runs with %s, cleanup does not clean it", a)
		}
	}
	if ctr.LivenessProbe != nil || ctr.ReadinessProbe != nil || ctr.StartupProbe != nil || len(ctr.Ports) != 0 {
		t.Errorf("cleanup pod probes or exposes the agent's listeners: %+v %+v %+v %v", ctr.LivenessProbe, ctr.ReadinessProbe, ctr.StartupProbe, ctr.Ports)
	}
	if !equalJSON(ctr.SecurityContext, agent.SecurityContext) || !equalJSON(ctr.VolumeMounts, agent.VolumeMounts) {
		t.Errorf("cleanup pod's privileges or mounts differ from the agent's")
	}
	if agent.LivenessProbe == nil || len(agent.Args) == 0 || agent.Args[0] == "cleanup" {
		t.Errorf("default values: not the agent (args %q)", agent.Args)
	}

	// With the flow log file on, cleanup removes it too, through the same mount.
	flowFile := map[string]any{"flowEvents": map[string]any{"file": map[string]any{"enabled": true}}}
	agent = typed[appsv1.DaemonSet](t, objects(t, render(t, testCase{"flow-file", Release{"npagent", "npagent"}, flowFile})), "DaemonSet").Spec.Template.Spec.Containers[0]
	flowFile["cleanup"] = true
	ctr = typed[appsv1.DaemonSet](t, objects(t, render(t, testCase{"cleanup-flow-file", Release{"npagent", "npagent"}, flowFile})), "DaemonSet").Spec.Template.Spec.Containers[0]
	flowArg := "--flow-log-file=/var/log/npagent/flows.log"
	if !slices.Contains(agent.Args, flowArg) || !slices.Contains(ctr.Args, flowArg) {
		t.Errorf("flow log file on: the agent's args %q, cleanup's %q; want %s in both", agent.Args, ctr.Args, flowArg)
	}
	if !equalJSON(ctr.VolumeMounts, agent.VolumeMounts) {
		t.Errorf("flow log file on: cleanup pod's mounts differ from the agent's")
	}
}

func equalJSON(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(x) == string(y)
}

// TestClusterRoleByEnforcingMode: only strict mode, which watches the node's pods,
// or the pod condition may read pods; standard reads the policy endpoint objects
// and nodes (its own Node's addresses) alone; the pod condition adds patching
// pods/status and reading namespaces (their labels: cluster policies' subjects).
func TestClusterRoleByEnforcingMode(t *testing.T) {
	endpoints := rbacv1.PolicyRule{APIGroups: []string{"networking.k8s.aws"}, Resources: []string{"policyendpoints", "clusterpolicyendpoints"}, Verbs: []string{"get", "list", "watch"}}
	pods := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}
	nodes := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}}
	podStatus := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}}
	namespaces := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}}
	for _, tc := range []struct {
		mode         string
		podCondition bool
		want         []rbacv1.PolicyRule
	}{
		{"standard", false, []rbacv1.PolicyRule{endpoints, nodes}},
		{"strict", false, []rbacv1.PolicyRule{endpoints, nodes, pods}},
		{"standard", true, []rbacv1.PolicyRule{endpoints, nodes, pods, podStatus, namespaces}},
		{"strict", true, []rbacv1.PolicyRule{endpoints, nodes, pods, podStatus, namespaces}},
	} {
		mode, want := tc.mode, tc.want
		r, err := Render(Dir("npagent"), Release{"npagent", "npagent"}, map[string]any{"enforcingMode": mode,
			"podCondition": map[string]any{"enabled": tc.podCondition}})
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		cr := typed[rbacv1.ClusterRole](t, objects(t, r), "ClusterRole")
		if fmt.Sprint(cr.Rules) != fmt.Sprint(want) {
			t.Errorf("%s, podCondition %v: ClusterRole rules %+v, want %+v", mode, tc.podCondition, cr.Rules, want)
		}
	}
}

// TestInAPIServer runs one kube-apiserver (with the controller's own CRDs, as a
// cluster has them) for: every object of every case created with a server-side dry
// run (the apiserver's validation and defaulting, the DaemonSet's pod template
// included), then the default RBAC applied for real and exercised as the service
// account.
func TestInAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs kube-apiserver and etcd")
	}
	cp := testenv.Start(t, testenv.WithCRDDir(testenv.UpstreamCRDDir(t)))
	ctx := context.Background()

	t.Run("dry-run", func(t *testing.T) {
		for _, c := range cases {
			objs := objects(t, render(t, c))
			// The namespace first, for real: the chart's own when it renders one.
			ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": c.rel.Namespace}}}
			if i := slices.IndexFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == "Namespace" }); i >= 0 {
				ns = objs[i]
				objs = slices.Delete(objs, i, i+1)
				if got := ns.GetLabels()["pod-security.kubernetes.io/enforce"]; got != "privileged" {
					t.Errorf("%s: Namespace enforces %q, want privileged (hostNetwork and hostPath are forbidden by baseline)", c.name, got)
				}
			}
			if err := cp.Client.Create(ctx, ns); err != nil {
				t.Fatalf("%s: create namespace %s: %v", c.name, c.rel.Namespace, err)
			}
			for _, o := range objs {
				if err := cp.Client.Create(ctx, o, client.DryRunAll, client.FieldValidation("Strict")); err != nil {
					t.Errorf("%s: dry-run create %s %s/%s: %v", c.name, o.GetKind(), o.GetNamespace(), o.GetName(), err)
				}
			}
		}
	})

	// PodSecurity admission: the agent's pod is admitted in the namespace the chart
	// renders (enforce: privileged) and refused at baseline, which forbids hostNetwork
	// and hostPath: the reason the namespace must be privileged.
	t.Run("pod-security", func(t *testing.T) {
		c := cases[2]
		ds := typed[appsv1.DaemonSet](t, objects(t, render(t, c)), "DaemonSet")
		pod := func(ns string) *corev1.Pod {
			p := &corev1.Pod{Spec: *ds.Spec.Template.Spec.DeepCopy()}
			p.Name, p.Namespace = "npagent-pod", ns
			p.Spec.ServiceAccountName = "" // the chart's service account exists only in a dry run
			return p
		}
		if err := cp.Client.Create(ctx, pod(c.rel.Namespace), client.DryRunAll); err != nil {
			t.Errorf("the agent's pod in the chart's namespace %s: %v", c.rel.Namespace, err)
		}
		baseline := &corev1.Namespace{}
		baseline.Name = "baseline"
		baseline.Labels = map[string]string{"pod-security.kubernetes.io/enforce": "baseline"}
		if err := cp.Client.Create(ctx, baseline); err != nil {
			t.Fatal(err)
		}
		err := cp.Client.Create(ctx, pod(baseline.Name), client.DryRunAll)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "hostNetwork") || !strings.Contains(err.Error(), "hostPath") {
			t.Errorf("the agent's pod in a baseline namespace: err = %v, want Forbidden for hostNetwork and hostPath", err)
		}
	})

	// The agent that only reads: podCondition off (on by default, it adds the pod
	// watch and pods/status patch, which TestPodStatusAdmission exercises).
	t.Run("rbac", func(t *testing.T) {
		c := testCase{"read-only", cases[0].rel, map[string]any{"podCondition": map[string]any{"enabled": false}}}
		objs := objects(t, render(t, c))
		cr := typed[rbacv1.ClusterRole](t, objs, "ClusterRole")
		want := []rbacv1.PolicyRule{{APIGroups: []string{"networking.k8s.aws"}, Resources: []string{"policyendpoints", "clusterpolicyendpoints"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}}} // its own Node's addresses
		if fmt.Sprint(cr.Rules) != fmt.Sprint(want) {
			t.Errorf("ClusterRole rules %+v, want only %+v", cr.Rules, want)
		}
		for _, o := range objs {
			switch o.GetKind() {
			case "ServiceAccount", "ClusterRole", "ClusterRoleBinding":
				if err := cp.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
					t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
				}
			}
		}
		sa := typed[corev1.ServiceAccount](t, objs, "ServiceAccount")
		user := fmt.Sprintf("system:serviceaccount:%s:%s", sa.Namespace, sa.Name)

		// What the agent does, as the agent.
		agentConfig := rest.CopyConfig(cp.Config)
		agentConfig.Impersonate = rest.ImpersonationConfig{UserName: user}
		agent, err := client.NewWithWatch(agentConfig, client.Options{Scheme: cp.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		if err := agent.List(ctx, &v1alpha1.PolicyEndpointList{}); err != nil {
			t.Errorf("list PolicyEndpoints in every namespace: %v", err)
		}
		if err := agent.List(ctx, &v1alpha1.ClusterPolicyEndpointList{}); err != nil {
			t.Errorf("list ClusterPolicyEndpoints: %v", err)
		}
		for _, l := range []client.ObjectList{&v1alpha1.PolicyEndpointList{}, &v1alpha1.ClusterPolicyEndpointList{}} {
			w, err := agent.Watch(ctx, l)
			if err != nil {
				t.Errorf("watch %T: %v", l, err)
				continue
			}
			w.Stop()
		}
		// NotFound, not Forbidden: the agent may get them.
		if err := agent.Get(ctx, client.ObjectKey{Namespace: "default", Name: "absent"}, &v1alpha1.PolicyEndpoint{}); !apierrors.IsNotFound(err) {
			t.Errorf("get PolicyEndpoint: err = %v, want NotFound", err)
		}
		if err := agent.Get(ctx, client.ObjectKey{Name: "absent"}, &v1alpha1.ClusterPolicyEndpoint{}); !apierrors.IsNotFound(err) {
			t.Errorf("get ClusterPolicyEndpoint: err = %v, want NotFound", err)
		}
		pe := &v1alpha1.PolicyEndpoint{}
		pe.Name, pe.Namespace = "written-by-agent", "default"
		pe.Spec.PolicyRef.Name = "x"
		if err := agent.Create(ctx, pe); !apierrors.IsForbidden(err) {
			t.Errorf("create PolicyEndpoint: err = %v, want Forbidden (the agent only reads)", err)
		}
		if err := agent.Delete(ctx, pe); !apierrors.IsForbidden(err) {
			t.Errorf("delete PolicyEndpoint: err = %v, want Forbidden", err)
		}
		if err := agent.List(ctx, &corev1.SecretList{}); !apierrors.IsForbidden(err) {
			t.Errorf("list Secrets: err = %v, want Forbidden", err)
		}
		if err := agent.List(ctx, &corev1.PodList{}); !apierrors.IsForbidden(err) {
			t.Errorf("list Pods: err = %v, want Forbidden", err)
		}

		// Every verb, by SubjectAccessReview: read both kinds, nothing else.
		allowed := func(group, res, verb, ns string) bool {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               user,
				Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + sa.Namespace, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Group: group, Resource: res, Verb: verb, Namespace: ns},
			}}
			if err := cp.Client.Create(ctx, sar); err != nil {
				t.Fatalf("SubjectAccessReview: %v", err)
			}
			return sar.Status.Allowed
		}
		for _, res := range []string{"policyendpoints", "clusterpolicyendpoints"} {
			for _, verb := range []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"} {
				for _, ns := range []string{"", "default"} {
					if res == "clusterpolicyendpoints" && ns != "" {
						continue
					}
					want := verb == "get" || verb == "list" || verb == "watch"
					if got := allowed("networking.k8s.aws", res, verb, ns); got != want {
						t.Errorf("%s %s (namespace %q): allowed %v, want %v", verb, res, ns, got, want)
					}
				}
			}
			for _, sub := range []string{"status"} {
				sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
					User:               user,
					ResourceAttributes: &authorizationv1.ResourceAttributes{Group: "networking.k8s.aws", Resource: res, Subresource: sub, Verb: "update"},
				}}
				if err := cp.Client.Create(ctx, sar); err != nil {
					t.Fatal(err)
				}
				if sar.Status.Allowed {
					t.Errorf("update %s/%s allowed, want denied (the agent writes no status)", res, sub)
				}
			}
		}
		for _, verb := range []string{"get", "list", "watch"} { // its own Node's addresses
			if !allowed("", "nodes", verb, "") {
				t.Errorf("%s nodes denied, want allowed", verb)
			}
		}
		for _, verb := range []string{"update", "patch", "delete"} {
			if allowed("", "nodes", verb, "") {
				t.Errorf("%s nodes allowed, want denied", verb)
			}
		}
		for _, r := range []struct{ group, res string }{{"", "secrets"}, {"", "pods"}, {"", "configmaps"}, {"networking.k8s.io", "networkpolicies"}} {
			for _, verb := range []string{"get", "list", "watch"} {
				if allowed(r.group, r.res, verb, "") {
					t.Errorf("%s %s allowed, want denied", verb, r.res)
				}
			}
		}
	})
}

// TestPodMonitorValue: monitoring.podMonitor.enabled renders a PodMonitor that
// selects the agent's pods on its metrics port, asks for the protobuf exposition
// first (the native histograms) and names instances by node; off by default, and
// off while cleanup runs (no agent to scrape).
func TestPodMonitorValue(t *testing.T) {
	kinds := func(r Rendered) []string {
		var out []string
		for _, o := range objects(t, r) {
			out = append(out, o.GetKind())
		}
		return out
	}
	if k := kinds(render(t, cases[0])); slices.Contains(k, "PodMonitor") {
		t.Errorf("default values render a PodMonitor: %v", k)
	}
	on := map[string]any{"monitoring": map[string]any{"podMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prom"}, "interval": "30s"}}}
	objs := objects(t, render(t, testCase{"podmonitor", Release{"npagent", "npagent"}, on}))
	i := slices.IndexFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == "PodMonitor" })
	if i < 0 {
		t.Fatalf("monitoring.podMonitor.enabled: no PodMonitor among %v", kinds(render(t, testCase{"podmonitor", Release{"npagent", "npagent"}, on})))
	}
	pm := objs[i]
	ds := typed[appsv1.DaemonSet](t, objs, "DaemonSet")
	if pm.GetAPIVersion() != "monitoring.coreos.com/v1" || pm.GetNamespace() != "npagent" || pm.GetLabels()["release"] != "prom" {
		t.Errorf("PodMonitor %s %s/%s labels %v", pm.GetAPIVersion(), pm.GetNamespace(), pm.GetName(), pm.GetLabels())
	}
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	for k, v := range sel {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("PodMonitor selects %s=%s, the agent's pods have %q", k, v, ds.Spec.Template.Labels[k])
		}
	}
	protocols, _, _ := unstructured.NestedStringSlice(pm.Object, "spec", "scrapeProtocols")
	if len(protocols) == 0 || protocols[0] != "PrometheusProto" {
		t.Errorf("scrapeProtocols %v, want PrometheusProto first (native histograms)", protocols)
	}
	if native, _, _ := unstructured.NestedBool(pm.Object, "spec", "scrapeNativeHistograms"); !native {
		t.Error("scrapeNativeHistograms not set")
	}
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	port := ds.Spec.Template.Spec.Containers[0].Ports[0].Name
	if len(eps) != 1 || eps[0].(map[string]any)["port"] != port || eps[0].(map[string]any)["interval"] != "30s" {
		t.Errorf("podMetricsEndpoints %v, want the container port %q every 30s", eps, port)
	}
	on["cleanup"] = true
	if k := kinds(render(t, testCase{"podmonitor-cleanup", Release{"npagent", "npagent"}, on})); slices.Contains(k, "PodMonitor") {
		t.Errorf("cleanup renders a PodMonitor: %v", k)
	}
	if _, err := Render(Dir("npagent"), Release{"npagent", "npagent"}, map[string]any{"monitoring": map[string]any{"podMonitor": map[string]any{"enabeld": true}}}); err == nil {
		t.Error("a misspelt monitoring.podMonitor key renders")
	}
}

// TestNotesSayWhatToCheck: after an install the notes say how to verify it (the
// rollout, an object programmed, the metrics and how to scrape the native
// histogram, the probes' address), with the values in force; under cleanup they
// say how to finish the uninstall instead.
func TestNotesSayWhatToCheck(t *testing.T) {
	notes := render(t, cases[0]).Notes
	for _, want := range []string{"rollout status daemonset/npagent", "npagent explain pe/", "port 9437", "PrometheusProto",
		"127.0.0.1:9438", "_count and _sum", "cleanup=true"} {
		if !strings.Contains(notes, want) {
			t.Errorf("default notes do not say %q:\n%s", want, notes)
		}
	}
	if strings.Contains(notes, "PodMonitor") {
		t.Errorf("default notes mention a PodMonitor the chart did not render:\n%s", notes)
	}
	custom := render(t, cases[1]).Notes
	if !strings.Contains(custom, "port 9555") || !strings.Contains(custom, "127.0.0.1:9556") || !strings.Contains(custom, "rollout status daemonset/custom-npagent") {
		t.Errorf("notes do not follow metrics.port, health.port and the release's name:\n%s", custom)
	}
	pm := render(t, testCase{"podmonitor", Release{"npagent", "npagent"}, map[string]any{"monitoring": map[string]any{"podMonitor": map[string]any{"enabled": true}}}}).Notes
	if !strings.Contains(pm, "PodMonitor npagent/npagent") {
		t.Errorf("notes do not name the PodMonitor:\n%s", pm)
	}
	cl := render(t, testCase{"cleanup", Release{"npagent", "npagent"}, map[string]any{"cleanup": true}}).Notes
	if !strings.Contains(cl, "helm uninstall npagent --namespace npagent") || strings.Contains(cl, "What to check") {
		t.Errorf("cleanup notes do not say how to finish the uninstall:\n%s", cl)
	}
}

// TestRelayValue: relay.enabled renders the relay tier (a Deployment of
// relay.replicas, its Service, service account and RBAC, a cert-manager Certificate
// when an issuer is named) and points the agents at it with the CA of its secret;
// off by default; on without TLS fails the render, naming what to set.
func TestRelayValue(t *testing.T) {
	kindsOf := func(objs []*unstructured.Unstructured) []string {
		var out []string
		for _, o := range objs {
			out = append(out, o.GetKind()+"/"+o.GetName())
		}
		return out
	}
	if k := kindsOf(objects(t, render(t, cases[0]))); slices.Contains(k, "Deployment/npagent-relay") {
		t.Errorf("default values render the relay: %v", k)
	}
	on := map[string]any{"relay": map[string]any{"enabled": true, "replicas": 3,
		"tls": map[string]any{"certManager": map[string]any{"issuer": "cluster-ca", "issuerKind": "ClusterIssuer"}}}}
	c := testCase{"relay", Release{"npagent", "npagent"}, on}
	kv, err := chartutil.ParseKubeVersion(KubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range lint.AllWithKubeVersion(Dir("npagent"), on, c.rel.Namespace, kv).Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("relay: helm lint: %s", m)
		}
	}
	objs := objects(t, render(t, c))
	k := kindsOf(objs)
	for _, want := range []string{"Deployment/npagent-relay", "Service/npagent-relay", "ServiceAccount/npagent-relay",
		"ClusterRole/npagent-relay", "ClusterRoleBinding/npagent-relay", "Certificate/npagent-relay"} {
		if !slices.Contains(k, want) {
			t.Errorf("relay.enabled renders no %s (rendered %v)", want, k)
		}
	}
	var dep *appsv1.Deployment
	var role *rbacv1.ClusterRole
	for _, o := range objs {
		switch o.GetKind() + "/" + o.GetName() {
		case "Deployment/npagent-relay":
			dep = new(appsv1.Deployment)
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, dep, true); err != nil {
				t.Fatal(err)
			}
		case "ClusterRole/npagent-relay":
			role = new(rbacv1.ClusterRole)
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, role, true); err != nil {
				t.Fatal(err)
			}
		}
	}
	if dep == nil || role == nil {
		t.Fatal("no relay Deployment or ClusterRole")
	}
	if *dep.Spec.Replicas != 3 || dep.Spec.Template.Spec.Containers[0].Args[0] != "relay" ||
		dep.Spec.Template.Spec.Volumes[0].Secret.SecretName != "npagent-relay-tls" {
		t.Errorf("relay Deployment: replicas %d, args %v, volumes %+v", *dep.Spec.Replicas, dep.Spec.Template.Spec.Containers[0].Args, dep.Spec.Template.Spec.Volumes)
	}
	var rules []string
	for _, r := range role.Rules {
		rules = append(rules, strings.Join(r.Resources, ",")+":"+strings.Join(r.Verbs, ","))
	}
	for _, want := range []string{"policyendpoints,clusterpolicyendpoints:list,watch", "nodes:get,list,watch", "tokenreviews:create", "subjectaccessreviews:create"} {
		if !slices.Contains(rules, want) {
			t.Errorf("relay ClusterRole rules %v lack %s", rules, want)
		}
	}
	ds := typed[appsv1.DaemonSet](t, objs, "DaemonSet")
	args := ds.Spec.Template.Spec.Containers[0].Args
	if !slices.Contains(args, "--relay-url=https://npagent-relay.npagent.svc:443") || !slices.Contains(args, "--relay-ca=/etc/npagent/relay-ca/ca.crt") {
		t.Errorf("the agents are not pointed at the relay: %v", args)
	}
	found := false
	for _, v := range ds.Spec.Template.Spec.Volumes {
		found = found || (v.Secret != nil && v.Secret.SecretName == "npagent-relay-tls")
	}
	if !found {
		t.Errorf("the agents do not mount the relay's CA: %+v", ds.Spec.Template.Spec.Volumes)
	}
	_, err = Render(Dir("npagent"), Release{"npagent", "npagent"}, map[string]any{"relay": map[string]any{"enabled": true}})
	if err == nil || !strings.Contains(err.Error(), "relay.tls.secretName") {
		t.Errorf("relay.enabled without TLS: err = %v, want a failure naming relay.tls.secretName", err)
	}
}

// TestChartMemoryFromClusterSize: memory.clusterObjects sets the memory request and
// limit from the formula of docs/explanation/scale.md (rounded up to MiB), keeps the
// CPU request, and GOMEMLIMIT below 100 % follows the computed limit.
func TestChartMemoryFromClusterSize(t *testing.T) {
	c := testCase{"sized", cases[0].rel, map[string]any{
		"memory":            map[string]any{"clusterObjects": 50000},
		"goMemLimitPercent": 90,
	}}
	ctr := typed[appsv1.DaemonSet](t, objects(t, render(t, c)), "DaemonSet").Spec.Template.Spec.Containers[0]
	mi := func(base, perObject int64) string {
		return fmt.Sprintf("%dMi", base+(50000*perObject+1<<20-1)>>20)
	}
	if got, want := ctr.Resources.Requests.Memory().String(), mi(48, 2500); got != want {
		t.Errorf("memory request %s, want %s", got, want)
	}
	if got, want := ctr.Resources.Limits.Memory().String(), mi(96, 10000); got != want {
		t.Errorf("memory limit %s, want %s", got, want)
	}
	if got := ctr.Resources.Requests.Cpu().String(); got != "50m" {
		t.Errorf("cpu request %s, want the default 50m kept", got)
	}
	limit := ctr.Resources.Limits.Memory().Value()
	if got, want := envByName(t, ctr, "GOMEMLIMIT").Value, fmt.Sprint(limit*90/100); got != want {
		t.Errorf("GOMEMLIMIT %q, want %s (90%% of the computed limit)", got, want)
	}
}
