package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/testenv/netlab"
	"github.com/npagent/npagent/internal/testenv/skip"
)

// openDataplaneLab is a pin directory under the host's bpffs and a veth for a pod,
// both removed at cleanup; it skips unless run as root.
func openDataplaneLab(t *testing.T) (pin string, ifindex int) {
	t.Helper()
	if !skip.Root() {
		skip.Unmet(t, "needs root (CAP_BPF, CAP_NET_ADMIN) to open the eBPF dataplane")
	}
	netlab.HostBPFFS(t) // the host's part: the agent never mounts it
	pin = filepath.Join("/sys/fs/bpf", fmt.Sprintf("npagent-cmdtest-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-")))
	t.Cleanup(func() { _ = os.RemoveAll(pin) })
	name := fmt.Sprintf("npo%d", os.Getpid()%100000)
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
		t.Fatalf("create veth %s: %v", name, err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(l) })
	return pin, l.Attrs().Index
}

// A start that finds a pod's pinned state but not its links re-attaches them and
// logs it naming the interface; a start asking for other map or connection table
// sizes than the pinned ones fails naming the flags and the pin directory.
func TestOpenDataplaneLogsReattachAndNamesSizeFlags(t *testing.T) {
	pin, ifindex := openDataplaneLab(t)
	cfg := config{Dataplane: dataplaneEBPF, BPFFSPath: pin, MapEntriesV4: 4096, MapEntriesV6: 1024, ConntrackEntries: 512}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	dp, err := openDataplane(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	pol := bpfmaps.PodPolicy{Ingress: bpfmaps.DirectionPolicy{Isolated: true, Allow: []bpfmaps.Rule{{CIDR: netip.MustParsePrefix("10.1.0.0/16")}}}}
	if _, err := dp.Commit(ifindex, pol); err != nil {
		t.Fatal(err)
	}
	if err := dp.Close(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"from_pod", "to_pod"} {
		l, err := link.LoadPinnedLink(filepath.Join(pin, "links", fmt.Sprintf("%d-%s", ifindex, name)), nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = l.Unpin()
		_ = l.Close()
	}

	dp, err = openDataplane(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.Close(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "re-attached") || !strings.Contains(logs.String(), fmt.Sprintf("ifindex=%d", ifindex)) {
		t.Errorf("log does not name the re-attached interface %d:\n%s", ifindex, logs.String())
	}

	cfg.MapEntriesV4 = 2048
	if dp, err := openDataplane(cfg, log); err == nil {
		_ = dp.Close()
		t.Fatal("opened pinned maps of 4096 IPv4 entries with --max-entries-ipv4=2048")
	} else if !errors.Is(err, bpfmaps.ErrPinnedCapacity) {
		t.Fatalf("open with other sizes: %v, want ErrPinnedCapacity", err)
	} else {
		for _, s := range []string{"--max-entries-ipv4", pin, "4096", "2048", "Resizing the maps"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not say %q", err, s)
			}
		}
	}
	cfg.MapEntriesV4, cfg.ConntrackEntries = 4096, 1024
	if dp, err := openDataplane(cfg, log); err == nil {
		_ = dp.Close()
		t.Fatal("opened pinned connection tables of 512 entries with --conntrack-entries=1024")
	} else if !errors.Is(err, bpfmaps.ErrPinnedCapacity) {
		t.Fatalf("open with another connection table size: %v, want ErrPinnedCapacity", err)
	} else {
		for _, s := range []string{"--conntrack-entries", "connection tables", pin, "512", "1024", "Resizing the maps"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q does not say %q", err, s)
			}
		}
	}
}
