// Package podcond is the pod condition npagent writes on the pods of its node: its
// type, its reasons, and the one pure function that turns what the node's agent knows
// of a pod (Facts) into the condition (Compute). internal/reconcile gathers the facts
// and patches pods/status; cmd/npagent's status and wait subcommands read the
// condition back through the apiserver with the same names.
//
// What it promises: Compute is deterministic (objects sorted, message bounded), so an
// agent that restarts, relists or resyncs computes the very condition it wrote before
// and writes nothing; one reason per state, chosen by a fixed precedence (the most
// severe wins).
//
// Standard library only.
package podcond
