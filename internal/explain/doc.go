// Package explain is the node's read model for an operator ("is my policy applied
// here? why was it slow?"): the JSON wire types of the debug API (ObjectExplain,
// PodExplain, VerdictExplain and what they hold), the bounded per-uid History that keeps what is
// gone by the time someone asks (versions with their trigger, receipt and sync
// outcome; reports with their phases), the API's handler (Server) and the client
// `npagent explain` and `npagent wait` use (Client).
//
// What it promises: the History holds at most 8 versions and 4 reports (8 attempts
// each) per uid and is dropped with the uid, so it stays O(live objects); the Server
// answers 503 until its Source is set and never writes anything; the Client wraps
// every failure to reach the agent in ErrUnreachable.
//
// internal/reconcile is the Source (it reads its caches, pod table and seen-set when
// asked) and feeds the History; cmd/npagent listens on the unix socket and prints,
// and answers GET /v1/verdict (VerdictSource) by judging the packet with the
// dataplane, which this package does not know.
// The package needs report and the standard library only.
package explain
