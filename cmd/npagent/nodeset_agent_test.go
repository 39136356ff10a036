package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
	"github.com/npagent/npagent/internal/testenv/netlab"
)

// nsGet GETs url from network namespace ns (the agent's health listener is on the
// node's loopback).
func nsGet(ns, url string) (int, string, error) {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
			return netlab.In(ns, func() (net.Conn, error) { return net.DialTimeout(network, addr, time.Second) })
		}}}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), nil
}

// TestAgentNodeSetIsTheNodesOwn runs the binary in a node whose other interfaces
// hold addresses that are not the node: kube-ipvs0 with a Service VIP (IPVS mode),
// a node-local DNS cache's interface with its VIP, an interface toward another
// network. A pod whose egress is isolated reaches its node IP (node traffic is
// always allowed) and none of those. Then the node's uplink gets 1100 addresses,
// more than the dataplane's node set holds: the agent keeps running, the node IP
// still exempt, and /readyz says what did not fit.
func TestAgentNodeSetIsTheNodesOwn(t *testing.T) {
	skipIfShort(t)
	l := newNodeLab(t, "npn", 211)
	id := strings.Split(l.nodeIP, ".")[2] // the lab's, from the pid
	vips := map[string]string{
		"kube-ipvs0":   "10.96." + id + ".10",
		"nodelocaldns": "169.254.20.10",
		"oth0":         "10.213." + id + ".1",
	}
	for dev, addr := range vips {
		if dev == "oth0" || exec.Command("ip", "-n", l.node, "link", "add", dev, "type", "dummy").Run() != nil {
			netlab.Run(t, "ip", "-n", l.node, "link", "add", dev, "type", "veth", "peer", "name", dev+"p")
		}
		netlab.Run(t, "ip", "-n", l.node, "addr", "add", addr+"/32", "dev", dev)
		netlab.Run(t, "ip", "-n", l.node, "link", "set", dev, "up")
	}
	netlab.ServeEcho(t, l.node, "tcp4", "0.0.0.0:7070")
	netlab.ServeEcho(t, l.peer, "tcp4", l.peerIP+":7070")
	reach := func(addr string) error {
		return netlab.Exchange(l.pod, "tcp4", net.JoinHostPort(addr, "7070"), 400*time.Millisecond)
	}
	for _, addr := range append([]string{l.nodeIP, l.peerIP}, vips["kube-ipvs0"], vips["nodelocaldns"], vips["oth0"]) {
		testenv.Eventually(t, 10*time.Second, "pod reaches "+addr+" before any policy", func() bool { return reach(addr) == nil })
	}

	cp, a := l.startAgent(t)
	pe := &v1alpha1.PolicyEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-egress", Namespace: "default",
			Annotations: map[string]string{v1alpha1.AnnotationLastChangeTriggerTime: time.Now().UTC().Format(time.RFC3339Nano)}},
		Spec: v1alpha1.PolicyEndpointSpec{
			PolicyRef:            v1alpha1.PolicyReference{Name: "deny-egress", Namespace: "default"},
			PodIsolation:         []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			PodSelectorEndpoints: []v1alpha1.PodEndpoint{{HostIP: v1alpha1.NetworkAddress(l.nodeIP), PodIP: v1alpha1.NetworkAddress(l.podIP), Name: "web-0", Namespace: "default"}},
		},
	}
	if err := cp.Client.Create(context.Background(), pe); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "pod denied to the peer once deny-egress is programmed", func() bool { return reach(l.peerIP) != nil })
	if err := reach(l.nodeIP); err != nil {
		t.Errorf("pod to its node IP: %v, want node traffic allowed", err)
	}
	for dev, addr := range vips {
		if reach(addr) == nil {
			t.Errorf("pod with egress denied reached %s on %s: exempt as if it were the node", addr, dev)
		}
	}

	// More node addresses than the dataplane's node set holds.
	var batch strings.Builder
	for i := range 1100 {
		fmt.Fprintf(&batch, "addr add 10.214.%d.%d/32 dev up0\n", i/250, 1+i%250)
	}
	cmd := exec.Command("ip", "-n", l.node, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ip -batch: %v\n%s", err, out)
	}
	testenv.Eventually(t, 60*time.Second, "/readyz to say the node's addresses do not fit", func() bool {
		code, body, err := nsGet(l.node, a.healthURL+"/readyz")
		return err == nil && code == http.StatusServiceUnavailable && strings.Contains(body, "do not fit")
	})
	if code, body, err := nsGet(l.node, a.url+"/metrics"); err != nil || !strings.Contains(body, "npagent_dataplane_node_addresses_left_out") {
		t.Errorf("/metrics = %d %v, want npagent_dataplane_node_addresses_left_out", code, err)
	}
	if err := reach(l.nodeIP); err != nil {
		t.Errorf("pod to its node IP with the set cut: %v, want the node IP kept", err)
	}
	select {
	case <-a.done:
		t.Fatalf("agent exited: %v", a.exit)
	default:
	}
	if code := a.stop(t); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}
}
