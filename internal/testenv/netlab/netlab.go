package netlab

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/npagent/npagent/internal/testenv/skip"
)

// RequireIP skips (or, under NPAGENT_TEST_NO_SKIP, fails) a test when the ip
// command is missing; why says what the test would have built with it. Under
// -short (the unit tier) it skips: the unit tier builds no network.
func RequireIP(tb testing.TB, why string) {
	tb.Helper()
	if !skip.Root() {
		skip.Unmet(tb, "needs root and the ip command (iproute2) to %s", why)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		skip.Unmet(tb, "needs the ip command (iproute2) to %s", why)
	}
}

// Run runs a command and fails the test with its output when it fails.
func Run(tb testing.TB, args ...string) {
	tb.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		tb.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// AddNamespace creates network namespace name with its loopback up, and
// deletes it when the test ends (which also removes the veth ends inside).
func AddNamespace(tb testing.TB, name string) {
	tb.Helper()
	Run(tb, "ip", "netns", "add", name)
	tb.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	Run(tb, "ip", "-n", name, "link", "set", "lo", "up")
}

// In runs fn on a thread in network namespace ns ("" is the caller's own);
// sockets fn creates stay in ns. A thread that entered ns is discarded
// afterwards (its goroutine exits locked), so no other goroutine runs there.
func In[T any](ns string, fn func() (T, error)) (T, error) {
	if ns == "" {
		return fn()
	}
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		h, err := netns.GetFromName(ns)
		if err == nil {
			err = netns.Set(h)
			h.Close()
		}
		if err != nil {
			ch <- result{err: fmt.Errorf("enter netns %s: %w", ns, err)}
			return
		}
		v, err := fn()
		ch <- result{v, err}
	}()
	r := <-ch
	return r.v, r.err
}

// ServeEcho echoes TCP connections or UDP datagrams (network "tcp4", "udp6",
// ...) on addr in namespace ns until the test ends.
func ServeEcho(tb testing.TB, ns, network, addr string) {
	tb.Helper()
	if strings.HasPrefix(network, "tcp") {
		ln, err := In(ns, func() (net.Listener, error) { return net.Listen(network, addr) })
		if err != nil {
			tb.Fatalf("listen %s %s in netns %q: %v", network, addr, ns, err)
		}
		tb.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					_, _ = io.Copy(c, c)
				}()
			}
		}()
		return
	}
	pc, err := In(ns, func() (net.PacketConn, error) { return net.ListenPacket(network, addr) })
	if err != nil {
		tb.Fatalf("listen %s %s in netns %q: %v", network, addr, ns, err)
	}
	tb.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
}

// Exchange dials addr from namespace ns ("" is the caller's own), sends one
// message and waits for its echo; any step taking longer than timeout fails it.
// A nil error means the packets passed both ways.
func Exchange(ns, network, addr string, timeout time.Duration) error {
	c, err := In(ns, func() (net.Conn, error) { return net.DialTimeout(network, addr, timeout) })
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	msg := []byte("npagent " + network)
	if _, err := c.Write(msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != string(msg) {
		return errors.New("echo mismatch")
	}
	return nil
}

// HostBPFFS does what a node's init system does and the agent never does: it
// mounts bpffs at /sys/fs/bpf when nothing is mounted there (it is not mounted at
// boot on these machines). Tests that open the eBPF dataplane call it as the host.
func HostBPFFS(tb testing.TB) {
	tb.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return
	}
	if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, ""); err != nil {
		skip.Unmet(tb, "bpffs is not mounted at /sys/fs/bpf and mounting it failed (needs root): %v", err)
	}
}
