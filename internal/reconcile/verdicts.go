package reconcile

import "net/netip"

// VerdictPod names the pod whose interface holds committed state, for the
// dataplane's verdict counters (which know only the interface).
type VerdictPod struct {
	IP              netip.Addr
	Namespace, Name string // as the objects selecting it name it; empty if none does
}

// VerdictPods returns the pods with committed state by their interface index. It
// copies under the pod table's lock: O(pods), for a collection, not a hot path.
func (c *Controller) VerdictPods() map[int]VerdictPod { return c.pods.verdictPods() }

func (t *podTable) verdictPods() map[int]VerdictPod {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[int]VerdictPod, len(t.programmed))
	for ip, ifindex := range t.programmed {
		p := VerdictPod{IP: ip}
		for key := range t.podIndex[ip] {
			if st := t.objects[key]; st != nil && st.compiled != nil {
				if n, ok := st.compiled.PodNames[ip]; ok {
					p.Namespace, p.Name = n.Namespace, n.Name
					break
				}
			}
		}
		out[ifindex] = p
	}
	return out
}
