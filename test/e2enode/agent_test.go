package e2enode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/skip"
)

// agentImage finds make image's linux/amd64 docker-archive (bin/image/npagent-VERSION-amd64.tar,
// the newest if several) and returns its path and VERSION, the image's tag.
func agentImage(t *testing.T) (string, string) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "bin", "image", "npagent-*-amd64.tar"))
	if len(files) == 0 {
		skip.Unmet(t, "e2enode: no bin/image/npagent-*-amd64.tar: run make image (make e2e-node does)")
	}
	newest, newestTime := "", time.Time{}
	for _, f := range files {
		if st, err := os.Stat(f); err == nil && st.ModTime().After(newestTime) {
			newest, newestTime = f, st.ModTime()
		}
	}
	version := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(newest), "npagent-"), "-amd64.tar")
	return newest, version
}

// Capability bits (linux/capability.h).
const (
	capNetAdmin = 12
	capBPF      = 39
)

// procStatus reads the fields of /proc/PID/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// containerPID is the host PID of a pod's container's process, from containerd.
func (n *Node) containerPID(t *testing.T, pod *corev1.Pod) int {
	t.Helper()
	if len(pod.Status.ContainerStatuses) == 0 {
		t.Fatalf("pod %s has no container status", pod.Name)
	}
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	out, err := n.ctrRun("tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("ctr tasks ls: %q", line)
			}
			return pid
		}
	}
	t.Fatalf("container %s of pod %s not in ctr tasks ls:\n%s", id, pod.Name, out)
	return 0
}

// checkAgentPrivileges checks the agent's pod as declared and as the kernel runs it:
// exactly CAP_BPF and CAP_NET_ADMIN (effective, permitted and bounding), a seccomp
// filter (RuntimeDefault), no-new-privileges, a read-only root and the chart's host
// paths.
func (n *Node) checkAgentPrivileges(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	c := pod.Spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatalf("agent container has no securityContext.capabilities")
	}
	if got := fmt.Sprint(sc.Capabilities.Add); got != "[BPF NET_ADMIN]" {
		t.Errorf("capabilities.add %s, want [BPF NET_ADMIN]", got)
	}
	if got := fmt.Sprint(sc.Capabilities.Drop); got != "[ALL]" {
		t.Errorf("capabilities.drop %s, want [ALL]", got)
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccompProfile %v, want RuntimeDefault", sc.SeccompProfile)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("readOnlyRootFilesystem not true")
	}
	var hostPaths []string
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			hostPaths = append(hostPaths, v.HostPath.Path)
		}
	}
	slices.Sort(hostPaths)
	if got := fmt.Sprint(hostPaths); got != "[/run/npagent /sys/fs/bpf /var/lib/npagent]" {
		t.Errorf("host paths %s, want [/run/npagent /sys/fs/bpf /var/lib/npagent]", got)
	}

	pid := n.containerPID(t, pod)
	st := procStatus(t, pid)
	want := fmt.Sprintf("%016x", uint64(1)<<capNetAdmin|uint64(1)<<capBPF)
	for _, k := range []string{"CapEff", "CapPrm", "CapBnd"} {
		if st[k] != want {
			t.Errorf("agent process %d %s = %s, want %s (CAP_BPF + CAP_NET_ADMIN only)", pid, k, st[k], want)
		}
	}
	if st["Seccomp"] != "2" {
		t.Errorf("agent process %d Seccomp = %s, want 2 (a filter: RuntimeDefault)", pid, st["Seccomp"])
	}
	if st["NoNewPrivs"] != "1" {
		t.Errorf("agent process %d NoNewPrivs = %s, want 1", pid, st["NoNewPrivs"])
	}
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	rootRO := false
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == "/" {
			rootRO = slices.Contains(strings.Split(f[5], ","), "ro")
		}
	}
	if !rootRO {
		t.Errorf("agent process %d: / is not mounted read-only", pid)
	}
	t.Logf("agent process %d: CapEff=%s CapBnd=%s Seccomp=%s NoNewPrivs=%s, / read-only", pid, st["CapEff"], st["CapBnd"], st["Seccomp"], st["NoNewPrivs"])
}

// ingressPE is a PolicyEndpoint as the AWS controller writes one for a NetworkPolicy
// selecting pod and allowing ingress from each peer on TCP 8080 and UDP 8081.
func ingressPE(name string, pod *corev1.Pod, peers []*corev1.Pod) *v1alpha1.PolicyEndpoint {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	p8080, p8081 := int32(8080), int32(8081)
	var in []v1alpha1.EndpointInfo
	for _, p := range peers {
		in = append(in, v1alpha1.EndpointInfo{CIDR: v1alpha1.NetworkAddress(p.Status.PodIP), Ports: []v1alpha1.Port{
			{Protocol: &tcp, Port: &p8080}, {Protocol: &udp, Port: &p8081},
		}})
	}
	return &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: pod.Namespace,
			Annotations: map[string]string{v1alpha1.AnnotationLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)},
		},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:    v1alpha1.PolicyReference{Name: name, Namespace: pod.Namespace},
			PodSelector:  &metav1.LabelSelector{MatchLabels: pod.Labels},
			PodIsolation: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{{
				HostIP: v1alpha1.NetworkAddress(pod.Status.HostIP), PodIP: v1alpha1.NetworkAddress(pod.Status.PodIP),
				Name: pod.Name, Namespace: pod.Namespace,
			}},
			Ingress: in,
		},
	}
}

// matrix checks every (client, protocol) pair against want, retrying each until it
// matches or timeout passes (the agent programs asynchronously), and fails with the
// whole table otherwise.
func (n *Node) matrix(t *testing.T, server *corev1.Pod, clients []*corev1.Pod, want map[string]bool, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var table []string
		ok := true
		for _, c := range clients {
			for _, proto := range []string{"tcp", "udp"} {
				port := "8080"
				if proto == "udp" {
					port = "8081"
				}
				got := n.Connect(t, c, proto, server.Status.PodIP+":"+port)
				w := want[c.Name]
				mark := "ok"
				if got != w {
					mark, ok = "WRONG", false
				}
				table = append(table, fmt.Sprintf("%s -> %s %s/%s: reach=%v want=%v %s", c.Name, server.Name, proto, port, got, w, mark))
			}
		}
		if ok {
			t.Logf("matrix:\n  %s", strings.Join(table, "\n  "))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("matrix not as wanted after %v:\n  %s", timeout, strings.Join(table, "\n  "))
		}
		time.Sleep(time.Second)
	}
}

func createNamespace(t *testing.T, n *Node, name string) {
	t.Helper()
	if _, err := n.Kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The service-account controller creates "default", which pods need.
	n.waitFor(t, "serviceaccount "+name+"/default", 30*time.Second, func() error {
		_, err := n.Kube.CoreV1().ServiceAccounts(name).Get(context.Background(), "default", metav1.GetOptions{})
		return err
	})
}
