package e2enode

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/skip"
)

// NodeName is the name the kubelet registers its Node under.
const NodeName = "e2e-node"

// PodCIDR is host-local's range for the node's pods: one /24 no other test uses
// (netlab and cmd/npagent's node labs use 10.253.x.0/24).
const PodCIDR = "10.251.0.0/24"

// PauseImage is the sandbox image (test/e2enode/images/pause), imported from
// hack/tools.sh's cache.
const PauseImage = "localhost/npagent-e2e/pause:1"

// Node is a running single-node cluster: etcd and kube-apiserver (internal/testenv),
// kube-controller-manager, kube-scheduler, containerd with runc and the CNI plugins,
// and a kubelet registered as NodeName.
type Node struct {
	CP         *testenv.ControlPlane
	Kube       kubernetes.Interface
	Kubeconfig string // admin kubeconfig file (system:masters)
	Dir        string // every file of the node: configs, state, logs

	ctr       string // ctr binary
	ctrSock   string // containerd's socket
	nodeNSPID int    // a process in the node's mount namespace (containerd)
	procs     []*proc
	forward   []byte // net.ipv4.ip_forward before the node: ptp turns it on
	hostPaths []string
}

// agentHostPaths are the chart's host paths the agent fills (pins, state, socket):
// removed after the run when the node created them.
var agentHostPaths = []string{"/sys/fs/bpf/npagent", "/var/lib/npagent", "/run/npagent"}

const ipForward = "/proc/sys/net/ipv4/ip_forward"

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// kubeletSysctls are the kernel settings the kubelet insists on (its
// setupKernelTunables): it writes them when they differ, and fails with
// protectKernelDefaults. They are host-wide (kernel.panic_on_oops=1 turns any oops
// into a reboot), so the node never writes them on the host: in its own mount
// namespace each of these /proc/sys files is a bind mount of a plain file holding the
// value the kubelet wants (the values of k8s.io/component-helpers/node/util/sysctl).
var kubeletSysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// Start boots the node and stops it in t.Cleanup. It needs root (containerd, runc,
// the kubelet's cgroups, the CNI's veths); without root it skips (a failure under
// NPAGENT_TEST_NO_SKIP=1).
func Start(t *testing.T) *Node {
	t.Helper()
	if os.Geteuid() != 0 {
		skip.Unmet(t, "e2enode: needs root (containerd, runc, kubelet cgroups, CNI veths)")
	}
	for _, c := range []string{"unshare", "mount"} {
		if _, err := exec.LookPath(c); err != nil {
			skip.Unmet(t, "e2enode: needs %s (util-linux)", c)
		}
	}
	tools := map[string]string{}
	for _, name := range []string{"kubelet", "kube-scheduler", "kube-controller-manager", "containerd", "runc", "cni-plugins", "pause"} {
		tools[name] = testenv.ToolPath(t, name)
	}
	start := time.Now()
	dir, err := os.MkdirTemp("", "npagent-e2enode-")
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{Dir: dir}
	n.forward, _ = os.ReadFile(ipForward)
	for _, p := range agentHostPaths {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			n.hostPaths = append(n.hostPaths, p)
		}
	}
	// Cleanups run last-in first-out: the node's stop (which deletes pods through the
	// apiserver) must run before the control plane's.
	// The kubelet registers its Hostname address as NodeName, which no resolver knows:
	// the apiserver reaches it (exec, logs) at its InternalIP.
	// envtest disables the ServiceAccount admission plugin (no controller-manager there):
	// this node has one, and pods need their token volume. The replacement value is a
	// plugin nothing here uses (the flag cannot be unset).
	n.CP = testenv.Start(t, testenv.WithAPIServerArg("kubelet-preferred-address-types", "InternalIP"),
		testenv.WithAPIServerArg("disable-admission-plugins", "DefaultIngressClass"))
	t.Cleanup(func() { n.stop(t) })
	n.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	testenv.WriteKubeconfig(t, n.CP.Config, n.Kubeconfig)
	caFile := filepath.Join(dir, "ca.crt")
	must(t, os.WriteFile(caFile, n.CP.Config.CAData, 0o644))
	n.Kube = kubernetes.NewForConfigOrDie(n.CP.Config)

	n.startContainerd(t, tools)
	n.importImage(t, tools["pause"])
	n.startControllers(t, tools, caFile)
	n.startKubelet(t, caFile)
	n.waitNodeReady(t, 2*time.Minute)
	t.Logf("e2enode: node %s Ready %v after start (dir %s)", NodeName, time.Since(start).Round(time.Millisecond), dir)
	return n
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// startContainerd writes containerd's config (its own root, state and socket under
// Dir; CRI with runc and CNI ptp) and starts it in a new mount namespace, which the
// kubelet then joins (see kubeletSysctls).
func (n *Node) startContainerd(t *testing.T, tools map[string]string) {
	t.Helper()
	cdir := filepath.Join(n.Dir, "containerd")
	cniBin := filepath.Dir(tools["cni-plugins"])
	cniConf := filepath.Join(n.Dir, "cni", "net.d")
	must(t, os.MkdirAll(cniConf, 0o755))
	n.ctrSock = filepath.Join(cdir, "containerd.sock")
	n.ctr = filepath.Join(filepath.Dir(tools["containerd"]), "ctr")
	// ptp: one veth per pod, the pod's address as a /32 route on the host side and a
	// default route in the pod through the host (the AWS VPC CNI's shape). ipMasq off:
	// pod traffic keeps its source address, as policy needs. ptp turns on IPv4 forwarding
	// (restored in stop).
	must(t, os.WriteFile(filepath.Join(cniConf, "10-ptp.conflist"), []byte(fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "e2enode",
  "plugins": [{
    "type": "ptp",
    "ipMasq": false,
    "mtu": 1500,
    "ipam": {
      "type": "host-local",
      "ranges": [[{"subnet": %q}]],
      "routes": [{"dst": "0.0.0.0/0"}],
      "dataDir": %q
    }
  }]
}
`, PodCIDR, filepath.Join(n.Dir, "cni", "ipam"))), 0o644))
	cfg := fmt.Sprintf(`version = 4
root = %[1]q
state = %[2]q

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = %[3]q
  [plugins.'io.containerd.server.v1.ttrpc']
    address = %[4]q
  [plugins.'io.containerd.internal.v1.opt']
    path = %[5]q
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = %[6]q
  [plugins.'io.containerd.cri.v1.runtime']
    # The session has no CAP_SYS_RESOURCE (README): no process may lower its
    # oom_score_adj, so the kubelet's -998 for sandboxes is raised to containerd's own.
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = %[7]q
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%[8]q]
      conf_dir = %[9]q
`, filepath.Join(cdir, "root"), filepath.Join(cdir, "state"), n.ctrSock, filepath.Join(cdir, "ttrpc.sock"),
		filepath.Join(cdir, "opt"), PauseImage, tools["runc"], cniBin, cniConf)
	cfgFile := filepath.Join(n.Dir, "containerd.toml")
	must(t, os.WriteFile(cfgFile, []byte(cfg), 0o644))

	// The node's mount namespace: every mount copied private (so mounts made here — the
	// kubelet's volumes, containerd's snapshots, the pods' netns files under /run/netns,
	// a shared mount on the host — never propagate back and keep a pod's netns and veth
	// alive after the node), then made shared within it, as the kubelet and
	// HostToContainer volumes need.
	var script strings.Builder
	script.WriteString("set -e\nmount --make-rshared /\n")
	keys := make([]string, 0, len(kubeletSysctls))
	for k := range kubeletSysctls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	sysdir := filepath.Join(n.Dir, "sysctl")
	for _, k := range keys {
		f := filepath.Join(sysdir, strings.ReplaceAll(k, "/", "."))
		must(t, os.MkdirAll(sysdir, 0o755))
		must(t, os.WriteFile(f, []byte(kubeletSysctls[k]+"\n"), 0o644))
		fmt.Fprintf(&script, "mount --bind %q /proc/sys/%s\n", f, k)
	}
	fmt.Fprintf(&script, "exec %q --config %q\n", tools["containerd"], cfgFile)
	p := n.run(t, "containerd", "unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script.String())
	// containerd finds its shim on PATH.
	p.cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(tools["containerd"])+":"+os.Getenv("PATH"))
	n.startProc(t, p)
	n.nodeNSPID = p.cmd.Process.Pid
	n.waitFor(t, "containerd's socket", 60*time.Second, func() error {
		_, err := n.ctrRun("version")
		return err
	})
}

// ctrRun runs ctr against the node's containerd, in its k8s.io namespace (the CRI's).
func (n *Node) ctrRun(args ...string) (string, error) {
	cmd := exec.Command(n.ctr, append([]string{"--address", n.ctrSock, "--namespace", "k8s.io"}, args...)...)
	// stderr apart: ctr prints containerd's cgroup v1 deprecation warning there.
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s%s", strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return string(out), nil
}

// importImage imports a docker-archive or OCI archive into the node's containerd
// (linux/amd64), as an operator without a registry would (ctr images import).
func (n *Node) importImage(t *testing.T, archive string) {
	t.Helper()
	start := time.Now()
	out, err := n.ctrRun("images", "import", "--platform", "linux/amd64", archive)
	if err != nil {
		t.Fatalf("e2enode: import %s: %v", archive, err)
	}
	t.Logf("e2enode: imported %s in %v: %s", filepath.Base(archive), time.Since(start).Round(time.Millisecond), strings.TrimSpace(out))
}

// ImportImage imports an image archive (docker-archive or OCI archive tar).
func (n *Node) ImportImage(t *testing.T, archive string) { t.Helper(); n.importImage(t, archive) }

// TagImage tags the image ref (as the kubelet reports it, name:tag) with tag too: the
// same content under a new reference, which a DaemonSet rolls out as a new image.
func (n *Node) TagImage(t *testing.T, ref, tag string) {
	t.Helper()
	name := ref
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		name = ref[:i]
	}
	if out, err := n.ctrRun("images", "tag", "--force", ref, name+":"+tag); err != nil {
		t.Fatalf("e2enode: tag %s as %s: %v: %s", ref, tag, err, out)
	}
}

func (n *Node) startControllers(t *testing.T, tools map[string]string, caFile string) {
	t.Helper()
	// The service-account token controller signs with the apiserver's key; the root CA
	// publisher fills kube-root-ca.crt, which every pod's token volume mounts.
	n.startProc(t, n.run(t, "kube-controller-manager", tools["kube-controller-manager"],
		"--kubeconfig", n.Kubeconfig,
		"--authentication-kubeconfig", n.Kubeconfig,
		"--authorization-kubeconfig", n.Kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--service-account-private-key-file", n.CP.ServiceAccountKeyFile(),
		"--root-ca-file", caFile,
	))
	n.startProc(t, n.run(t, "kube-scheduler", tools["kube-scheduler"],
		"--kubeconfig", n.Kubeconfig,
		"--authentication-kubeconfig", n.Kubeconfig,
		"--authorization-kubeconfig", n.Kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
	))
}

// startKubelet runs the kubelet in the node's mount namespace. The settings this
// machine forces are in the README (cgroup v1 hybrid: failCgroupV1 false, cgroupfs).
func (n *Node) startKubelet(t *testing.T, caFile string) {
	t.Helper()
	root := filepath.Join(n.Dir, "kubelet")
	must(t, os.MkdirAll(root, 0o755))
	port := freePort(t)
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts cgroup v1 controllers at /sys/fs/cgroup (cgroup2 only at
# /sys/fs/cgroup/unified): the 1.37 kubelet refuses v1 unless told otherwise.
failCgroupV1: false
# No systemd as PID 1 here: cgroupfs, as containerd's runc options (SystemdCgroup false).
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%[1]s
port: %[2]d
healthzPort: 0
readOnlyPort: 0
# The apiserver reaches the kubelet (exec, logs) without a client certificate.
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
  x509:
    clientCAFile: %[3]q
authorization:
  mode: AlwaysAllow
failSwapOn: false
# A shared test machine: its disk and memory are never the node's own.
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  imagefs.available: "1%%"
  nodefs.inodesFree: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podLogsDir: %[4]q
volumePluginDir: %[5]q
registerNode: true
serializeImagePulls: false
shutdownGracePeriod: 0s
`, n.ctrSock, port, caFile, filepath.Join(n.Dir, "pod-logs"), filepath.Join(n.Dir, "volume-plugins"))
	cfgFile := filepath.Join(n.Dir, "kubelet.yaml")
	must(t, os.WriteFile(cfgFile, []byte(cfg), 0o644))
	kubelet := testenv.ToolPath(t, "kubelet")
	p := n.run(t, "kubelet", "nsenter", fmt.Sprintf("--mount=/proc/%d/ns/mnt", n.nodeNSPID), "--",
		kubelet,
		"--config", cfgFile,
		"--kubeconfig", n.Kubeconfig,
		"--root-dir", root,
		"--cert-dir", filepath.Join(root, "pki"),
		"--hostname-override", NodeName,
		"--v=2",
	)
	n.startProc(t, p)
}

func (n *Node) waitNodeReady(t *testing.T, timeout time.Duration) {
	t.Helper()
	n.waitFor(t, "node "+NodeName+" Ready", timeout, func() error {
		node, err := n.Kube.CoreV1().Nodes().Get(context.Background(), NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if c.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("node condition Ready=%s: %s %s", c.Status, c.Reason, c.Message)
			}
		}
		return fmt.Errorf("no Ready condition yet")
	})
}

// waitFor polls check until it succeeds; on timeout it fails the test with the last
// error and the tail of every process's log.
func (n *Node) waitFor(t *testing.T, what string, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = check(); err == nil {
			return
		}
		for _, p := range n.procs {
			select {
			case <-p.done:
				n.dumpLogs(t)
				t.Fatalf("e2enode: waiting for %s: %s exited: %v", what, p.name, p.cmd.ProcessState)
			default:
			}
		}
		if time.Now().After(deadline) {
			n.dumpLogs(t)
			t.Fatalf("e2enode: %s not reached in %v: %v", what, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (n *Node) run(t *testing.T, name string, argv ...string) *proc {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	// Its own process group: stop signals the group, so the wrapper's child goes too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return &proc{name: name, cmd: cmd, log: filepath.Join(n.Dir, name+".log"), done: make(chan struct{})}
}

func (n *Node) startProc(t *testing.T, p *proc) {
	t.Helper()
	f, err := os.Create(p.log)
	must(t, err)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("e2enode: start %s: %v", p.name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		f.Close()
		close(p.done)
	}()
	n.procs = append(n.procs, p)
}

// dumpLogs prints the last lines of every process's log into the test output.
func (n *Node) dumpLogs(t *testing.T) {
	t.Helper()
	for _, p := range n.procs {
		t.Logf("----- %s (last lines of %s)\n%s", p.name, p.log, tail(p.log, 40))
	}
}

func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var all []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		all = append(all, sc.Text())
	}
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// stop deletes every pod (so the kubelet tears down their sandboxes and the CNI its
// veths), then stops the kubelet, the controllers and containerd, kills what
// containerd's shims still run, and removes Dir.
func (n *Node) stop(t *testing.T) {
	if t.Failed() {
		n.dumpLogs(t)
	}
	if n.Kube != nil && n.kubeletRunning() {
		n.deleteAllPods(t, 90*time.Second)
	}
	// The kubelet first, so it restarts nothing; containerd last.
	for i := len(n.procs) - 1; i >= 0; i-- {
		p := n.procs[i]
		if p.name == "kubelet" {
			stopProc(t, p)
		}
	}
	// Whatever the kubelet left running (a failed run): killed through containerd, so
	// no container outlives the node.
	if n.ctr != "" {
		if out, err := n.ctrRun("tasks", "ls", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				_, _ = n.ctrRun("tasks", "kill", "--all", "--signal", "SIGKILL", id)
			}
		}
	}
	shims := n.shimPIDs()
	for i := len(n.procs) - 1; i >= 0; i-- {
		if n.procs[i].name != "kubelet" {
			stopProc(t, n.procs[i])
		}
	}
	for _, pid := range shims {
		// The shim's process group holds the containers it started.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, p := range n.hostPaths {
		_ = os.RemoveAll(p)
	}
	if len(n.forward) > 0 {
		_ = os.WriteFile(ipForward, n.forward, 0o644)
	}
	if n.Dir != "" && os.Getenv("NPAGENT_E2E_NODE_KEEP") == "" {
		if err := os.RemoveAll(n.Dir); err != nil {
			t.Logf("e2enode: remove %s: %v", n.Dir, err)
		}
	}
}

func (n *Node) kubeletRunning() bool {
	for _, p := range n.procs {
		if p.name == "kubelet" {
			select {
			case <-p.done:
				return false
			default:
				return true
			}
		}
	}
	return false
}

func (n *Node) deleteAllPods(t *testing.T, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	nss, err := n.Kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("e2enode: cleanup: %v", err)
		return
	}
	zero := int64(0)
	for _, ns := range nss.Items {
		_ = n.Kube.AppsV1().DaemonSets(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = n.Kube.AppsV1().Deployments(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = n.Kube.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	}
	for ctx.Err() == nil {
		pods, err := n.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err == nil && len(pods.Items) == 0 {
			// The kubelet stops the sandboxes (CNI DEL) after the API forgets the pods.
			if out, err := n.ctrRun("tasks", "ls", "-q"); err == nil && strings.TrimSpace(out) == "" {
				return
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("e2enode: cleanup: pods or tasks still there after %v", timeout)
}

// shimPIDs lists the running containerd-shim-runc-v2 processes started from this
// node's containerd (by their executable's path).
func (n *Node) shimPIDs() []int {
	if n.ctr == "" {
		return nil
	}
	shim := filepath.Join(filepath.Dir(n.ctr), "containerd-shim-runc-v2")
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err == nil && strings.TrimSuffix(exe, " (deleted)") == shim {
			pids = append(pids, pid)
		}
	}
	return pids
}

func stopProc(t *testing.T, p *proc) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Logf("e2enode: %s did not stop in 15s: SIGKILL", p.name)
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}
