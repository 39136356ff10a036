package podcond

import (
	"fmt"
	"slices"
	"strings"
)

// Type is the pod condition type npagent writes (spec.readinessGates may name it;
// kubectl wait --for=condition=npagent.io/PolicyProgrammed works).
const Type = "npagent.io/PolicyProgrammed"

// Status values, as corev1.ConditionStatus spells them.
const (
	True  = "True"
	False = "False"
)

// Reasons. True: Programmed (every object selecting the pod is programmed on its node
// at the version the agent holds) or NoPolicy (standard mode, nothing selects it: open
// by design). False: the others.
const (
	ReasonProgrammed         = "Programmed"
	ReasonNoPolicy           = "NoPolicy"
	ReasonPending            = "Pending"
	ReasonIsolated           = "Isolated"
	ReasonDeniedByStrictMode = "DeniedByStrictMode"
	ReasonRejected           = "Rejected"
	ReasonNoInterface        = "NoInterface"
)

// State is where one object selecting the pod stands on the pod's node.
type State uint8

const (
	// Programmed: the version the agent holds is committed to the pod.
	Programmed State = iota
	// Pending: a version the agent holds is not committed to the pod yet (not synced,
	// a commit being retried, a chunk of its policy not synced, a delete not applied).
	Pending
	// Rejected: the version the agent holds is invalid; the last valid one stays in
	// force.
	Rejected
	// Isolated: the object is invalid and has no valid version: the pod is isolated
	// in the directions it names.
	Isolated
)

// Object is one object selecting the pod: "PolicyEndpoint shop/allow-web-abcde".
type Object struct {
	Kind, Namespace, Name string
	State                 State
}

func (o Object) String() string {
	if o.Namespace == "" {
		return o.Kind + " " + o.Name
	}
	return o.Kind + " " + o.Namespace + "/" + o.Name
}

// Facts is what the node's agent knows of one pod.
type Facts struct {
	// Strict is the strict enforcing mode.
	Strict bool
	// Objects are the objects selecting the pod, in any order.
	Objects []Object
	// NoInterface: the pod has work (an object selects it, or strict mode denies it)
	// and its host-side interface is not there.
	NoInterface bool
	// StrictDenied: strict mode denies the pod now.
	StrictDenied bool
	// Uncommittable: the pod's policy could not be committed and it is isolated
	// meanwhile.
	Uncommittable bool
}

// Condition is the condition's status, reason and message.
type Condition struct {
	Status, Reason, Message string
}

// maxNamed bounds how many objects a message names.
const maxNamed = 8

// Compute turns facts into the condition. Precedence, most severe first: Isolated,
// Rejected, NoInterface, DeniedByStrictMode, Pending; else Programmed, or NoPolicy.
func Compute(f Facts) Condition {
	objs := slices.Clone(f.Objects)
	slices.SortFunc(objs, func(a, b Object) int {
		return strings.Compare(a.String(), b.String())
	})
	objs = slices.CompactFunc(objs, func(a, b Object) bool { return a == b })
	in := func(s State) []Object {
		var out []Object
		for _, o := range objs {
			if o.State == s {
				out = append(out, o)
			}
		}
		return out
	}
	switch isolated := in(Isolated); {
	case len(isolated) > 0:
		return Condition{False, ReasonIsolated, "isolated: invalid with no valid version: " + names(isolated)}
	case f.Uncommittable:
		return Condition{False, ReasonIsolated, "isolated: its policy could not be committed (retrying): " + names(objs)}
	}
	if rejected := in(Rejected); len(rejected) > 0 {
		return Condition{False, ReasonRejected, "rejected (the last valid version stays in force): " + names(rejected)}
	}
	if f.NoInterface {
		return Condition{False, ReasonNoInterface, "the pod's interface is not on the node yet" + selectedBy(objs)}
	}
	pending := in(Pending)
	if f.StrictDenied || (f.Strict && len(objs) == 0) {
		msg := "denied both ways (node traffic excepted) until a policy selecting it is programmed"
		if len(pending) > 0 {
			msg += "; pending: " + names(pending)
		}
		return Condition{False, ReasonDeniedByStrictMode, msg}
	}
	if len(pending) > 0 {
		return Condition{False, ReasonPending, "not programmed yet: " + names(pending)}
	}
	if len(objs) == 0 {
		return Condition{True, ReasonNoPolicy, "no policy selects the pod: open (standard mode)"}
	}
	return Condition{True, ReasonProgrammed, "programmed: " + names(objs)}
}

func selectedBy(objs []Object) string {
	if len(objs) == 0 {
		return ""
	}
	return "; selected by " + names(objs)
}

// names lists the objects, at most maxNamed, then how many more.
func names(objs []Object) string {
	var b strings.Builder
	for i, o := range objs {
		if i == maxNamed {
			fmt.Fprintf(&b, " and %d more", len(objs)-maxNamed)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(o.String())
	}
	return b.String()
}
