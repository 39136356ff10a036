// Package report is the hand-over between the packages that decide what happened
// to a policy change (reconcile, seen) and the one that turns it into signals
// (telemetry). It holds plain, typed data and nothing else: the policy Kind, the
// delivery Cause, the suppression Reason, one reported trigger (Record) with its
// commit Attempts and their Phases, a snapshot of the counters the loop and the
// seen-set own (Counts), and the Sink interface telemetry implements.
//
// It is a leaf: standard library only. Every package above it may import it; it
// imports none of them, so data flows one way (reconcile → report → telemetry)
// and telemetry never sees a Kubernetes type.
//
// Enums are small integers with a fixed set of values, so a consumer can index
// precomputed attribute sets by them (an array, not a map of strings).
package report
