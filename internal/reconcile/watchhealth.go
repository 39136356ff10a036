package reconcile

import (
	"fmt"
	"time"

	"github.com/npagent/npagent/internal/report"
)

// Each informer's watch health is a kubewatch.Health, recorded by its ListWatch
// (Controller.watch); these read it, with the stall rule (kubewatch.Health.Snapshot)
// judged against Config.WatchStallTimeout.

// watchCounts fills dst.Watch, stall judged at now against the configured bound.
func (c *Controller) watchCounts(dst *report.Counts, now time.Time) {
	for k := range dst.Watch {
		dst.Watch[k] = c.watch[k].Snapshot(now, c.cfg.WatchStallTimeout)
	}
}

// WatchProblem returns an error naming each informer whose watch is refused by a
// ready apiserver (at once: only a change of its rights cures it) or stalled at now
// (see kubewatch.Health.Snapshot), or nil. For /readyz.
func (c *Controller) WatchProblem(now time.Time) error {
	var err error
	for k := range c.watch {
		w := c.watch[k].Snapshot(now, c.cfg.WatchStallTimeout)
		var e error
		switch {
		case w.Refused != "":
			e = fmt.Errorf("%s watch refused by the apiserver: %s", report.Kind(k), w.Refused)
		case w.Stalled:
			state := "open"
			if !w.Established {
				state = "down"
			}
			e = fmt.Errorf("%s watch stalled: %s, nothing received for %v (--watch-stall-timeout %v)",
				report.Kind(k), state, w.Age.Round(time.Second), c.cfg.WatchStallTimeout)
		default:
			continue
		}
		if err == nil {
			err = e
		} else {
			err = fmt.Errorf("%w; %w", err, e)
		}
	}
	return err
}
