package e2enode

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/npagent/npagent/deploy/charts"
)

// helmConfig is Helm's action configuration for namespace ns, reaching the node's
// apiserver through the admin kubeconfig, releases stored as Secrets (helm's default).
func (n *Node) helmConfig(t *testing.T, ns string) *action.Configuration {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &n.Kubeconfig
	flags.Namespace = &ns
	cache := filepath.Join(n.Dir, "kube-cache") // not ~/.kube/cache
	flags.CacheDir = &cache
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, ns, "secret", func(format string, v ...any) { t.Logf("helm: "+format, v...) }); err != nil {
		t.Fatalf("helm init: %v", err)
	}
	return cfg
}

// AgentValues are the chart values a user of this node would set: the image make
// image built and imported (never pulled), the CNI's host-side interface prefix and
// its gateway addresses as the node's (--node-address-interfaces), no
// OTLP collector unless given, and the apiserver's address — this node runs no
// kube-proxy, so the kubernetes Service's ClusterIP leads nowhere and the agent's
// in-cluster config is pointed at the apiserver itself, as on any cluster without a
// service proxy.
func (n *Node) AgentValues(imageTag string) map[string]any {
	u, _ := url.Parse(n.CP.Config.Host)
	return map[string]any{
		"image": map[string]any{
			"repository": "npagent",
			"tag":        imageTag,
			"pullPolicy": "Never",
		},
		"podInterfacePrefixes": []any{"veth"},
		// ptp puts the pod's gateway on each host-side veth and the kubelet's probes
		// come from it (README): the chart's setting for such a CNI.
		"nodeAddressInterfaces": []any{"veth*"},
		"otlp":                  map[string]any{"endpoint": ""},
		"extraEnv": []any{
			map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": u.Hostname()},
			map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": u.Port()},
		},
	}
}

// InstallAgent creates namespace ns labelled for PodSecurity "privileged" (the chart's
// README: helm install records the release there first) and installs the npagent
// chart as release name, waiting for its objects (not for the pods: AgentPod does).
func (n *Node) InstallAgent(t *testing.T, ns, name string, values map[string]any) *release.Release {
	t.Helper()
	ctx := context.Background()
	_, err := n.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "privileged"},
	}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) { // a reinstall: the namespace stays
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	ch, err := loader.Load(charts.Dir("npagent"))
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	install := action.NewInstall(n.helmConfig(t, ns))
	install.ReleaseName = name
	install.Namespace = ns
	install.Timeout = 2 * time.Minute
	start := time.Now()
	rel, err := install.RunWithContext(ctx, ch, values)
	if err != nil {
		t.Fatalf("helm install %s/%s: %v", ns, name, err)
	}
	t.Logf("helm install %s (chart %s %s) in %v: %s", name, ch.Name(), ch.Metadata.Version, time.Since(start).Round(time.Millisecond), rel.Info.Status)
	return rel
}

// UninstallAgent uninstalls release name in ns and waits for its pods to be gone.
func (n *Node) UninstallAgent(t *testing.T, ns, name string) {
	t.Helper()
	un := action.NewUninstall(n.helmConfig(t, ns))
	un.Wait = true
	un.Timeout = 2 * time.Minute
	if _, err := un.Run(name); err != nil {
		t.Fatalf("helm uninstall %s/%s: %v", ns, name, err)
	}
}

// AgentPod waits for the DaemonSet's pod on the node to be Running and Ready.
func (n *Node) AgentPod(t *testing.T, ns string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var name string
	n.waitFor(t, "the agent's pod", timeout, func() error {
		pods, err := n.Kube.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName == NodeName || p.Status.Phase != "" {
				name = p.Name
				if err := ready(&p); err != nil {
					return fmt.Errorf("pod %s: %w; events: %s%s", p.Name, err, n.events(ns, p.Name), n.lastLogs(&p))
				}
				return nil
			}
		}
		return fmt.Errorf("no pod in %s yet", ns)
	})
	p, err := n.Kube.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ready(p *corev1.Pod) error {
	if p.Status.Phase != corev1.PodRunning {
		return errPending(p)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return errPending(p)
}

// lastLogs is the tail of the log of the pod's first container's previous run when it
// has restarted (what made it exit), else of its current run.
func (n *Node) lastLogs(p *corev1.Pod) string {
	if len(p.Status.ContainerStatuses) == 0 {
		return ""
	}
	lines := int64(30)
	opts := &corev1.PodLogOptions{Container: p.Spec.Containers[0].Name, TailLines: &lines, Previous: p.Status.ContainerStatuses[0].RestartCount > 0}
	b, err := n.Kube.CoreV1().Pods(p.Namespace).GetLogs(p.Name, opts).DoRaw(context.Background())
	if err != nil {
		// The kubelet's files, as a last resort.
		files, _ := filepath.Glob(filepath.Join(n.Dir, "pod-logs", fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID), opts.Container, "*.log"))
		var out string
		for _, f := range files {
			out += fmt.Sprintf("\n%s:\n%s", f, tail(f, 15))
		}
		return "\n(logs through the apiserver: " + err.Error() + ")" + out
	}
	return fmt.Sprintf("\nlogs (previous=%v):\n%s", opts.Previous, b)
}

// UpgradeAgent upgrades release name in ns to values (helm upgrade, Go) and waits for
// the DaemonSet's rollout: its one pod updated, Running and Ready.
func (n *Node) UpgradeAgent(t *testing.T, ns, name string, values map[string]any) *corev1.Pod {
	t.Helper()
	ch, err := loader.Load(charts.Dir("npagent"))
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	up := action.NewUpgrade(n.helmConfig(t, ns))
	up.Namespace = ns
	up.Timeout = 2 * time.Minute
	rel, err := up.RunWithContext(context.Background(), name, ch, values)
	if err != nil {
		t.Fatalf("helm upgrade %s/%s: %v", ns, name, err)
	}
	t.Logf("helm upgrade %s: revision %d %s", name, rel.Version, rel.Info.Status)
	n.waitFor(t, "the agent's rollout", 3*time.Minute, func() error {
		dss, err := n.Kube.AppsV1().DaemonSets(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil || len(dss.Items) != 1 {
			return fmt.Errorf("daemonsets: %v (%d)", err, len(dss.Items))
		}
		ds := dss.Items[0]
		st := ds.Status
		if st.ObservedGeneration != ds.Generation || st.UpdatedNumberScheduled != 1 || st.NumberReady != 1 || st.NumberUnavailable != 0 {
			return fmt.Errorf("daemonset %s: generation %d observed %d, updated %d, ready %d, unavailable %d",
				ds.Name, ds.Generation, st.ObservedGeneration, st.UpdatedNumberScheduled, st.NumberReady, st.NumberUnavailable)
		}
		return nil
	})
	return n.AgentPod(t, ns, time.Minute)
}
