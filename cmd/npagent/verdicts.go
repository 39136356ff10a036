package main

import (
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/npagent/npagent/internal/bpfmaps"
	"github.com/npagent/npagent/internal/explain"
	"github.com/npagent/npagent/internal/reconcile"
	"github.com/npagent/npagent/internal/telemetry"
)

// observeVerdicts hands telemetry the dataplane's verdict counters, named after the
// pods the reconcile loop programmed: read at each collection, nothing per packet.
// A failed read is logged (at most once a minute) and exports the last good one.
func observeVerdicts(tel *telemetry.Telemetry, ctrl *reconcile.Controller, dp bpfmaps.Dataplane, log *slog.Logger) {
	var mu sync.Mutex
	var last telemetry.VerdictCounts
	var logged time.Time
	err := tel.ObserveVerdicts(func() telemetry.VerdictCounts {
		mu.Lock()
		defer mu.Unlock()
		vc, err := dp.Verdicts()
		if err != nil {
			if time.Since(logged) > time.Minute {
				log.Warn("read verdict counters", "err", err)
				logged = time.Now()
			}
			return last
		}
		last = namedVerdicts(vc, ctrl.VerdictPods())
		return last
	})
	if err != nil {
		log.Error("verdict counters not exported", "err", err)
	}
}

// namedVerdicts turns the dataplane's counters (by interface, with the deciding
// rule's or the isolating objects' origins) into telemetry's: the pod's namespace
// and name, the deciding object's kind and name (its policy's name when it is a
// chunk of one) and the rule's index. The namespaced tier's allow and the default
// deny name the isolating objects: one by its name, several by their names joined
// by "+" (sorted), none (isolated without an object: strict mode, or a commit that
// failed) by nothing.
func namedVerdicts(vc bpfmaps.VerdictCounts, pods map[int]reconcile.VerdictPod) telemetry.VerdictCounts {
	out := telemetry.VerdictCounts{Lost: vc.Lost, Counts: make([]telemetry.Verdict, 0, len(vc.Counts))}
	for _, c := range vc.Counts {
		v := telemetry.Verdict{Direction: c.Direction.String(), Denied: c.Reason.Denied(), Audited: c.Audited, Reason: c.Reason.String(),
			Rule: -1, Packets: c.Packets, Bytes: c.Bytes}
		if p, ok := pods[c.Ifindex]; ok {
			v.Namespace, v.Pod = p.Namespace, p.Name
		}
		switch {
		case c.Rule != (bpfmaps.Origin{}):
			v.PolicyKind, v.PolicyName, v.Rule = c.Rule.Kind, originName(c.Rule), c.Rule.Index
		case len(c.Sources) > 0:
			v.PolicyKind = c.Sources[0].Kind
			names := make([]string, 0, len(c.Sources))
			for _, s := range c.Sources {
				names = append(names, originName(s))
			}
			slices.Sort(names)
			v.PolicyName = strings.Join(slices.Compact(names), "+")
		}
		out.Counts = append(out.Counts, v)
	}
	return out
}

// originName is the name an operator knows: the policy an object is a chunk of,
// else the object's own.
func originName(o bpfmaps.Origin) string {
	if o.Policy != "" {
		return o.Policy
	}
	return o.Name
}

// verdictSource answers the debug API as its Source does, adding to a pod's answer
// the verdict counters of its interface, read from the kernel's maps at the time.
type verdictSource struct {
	explain.Source
	read func() (bpfmaps.VerdictCounts, error)
}

func (s verdictSource) ExplainPod(q explain.PodQuery) explain.PodExplain {
	out := s.Source.ExplainPod(q)
	if out.Ifindex == 0 {
		return out
	}
	vc, err := s.read()
	if err != nil {
		return out
	}
	mine := bpfmaps.VerdictCounts{}
	for _, c := range vc.Counts {
		if c.Ifindex == out.Ifindex {
			mine.Counts = append(mine.Counts, c)
		}
	}
	for _, v := range namedVerdicts(mine, nil).Counts {
		word := "allow"
		switch {
		case v.Audited:
			word = "would_deny"
		case v.Denied:
			word = "deny"
		}
		out.Verdicts = append(out.Verdicts, explain.PodVerdict{Direction: v.Direction, Verdict: word, Reason: v.Reason,
			PolicyKind: v.PolicyKind, Policy: v.PolicyName, Rule: v.Rule, Packets: v.Packets, Bytes: v.Bytes})
	}
	return out
}
