// Package kubewatch is how the agent lists and watches its objects: a REST client
// for a custom resource group (NewRESTClient), a list request that decodes the
// answer in one pass (NewLister), a watch request that decodes each event in one
// pass (NewWatcher), and a ListWatch for client-go's informers that
// keeps delivering across apiserver restarts and 410 Gone (NewListWatch), recording
// what it sees in a Health (arrivals, errors, relists by cause) judged by the stall
// rule (Health.Snapshot); and an error handler for every informer's reflector
// (ErrorHandler) that logs a refused or failed list or watch at WARN, and at ERROR
// only once the failures have lasted 30 s — client-go's default logs each at ERROR,
// and a freshly restarted apiserver refuses for a moment while its RBAC authorizer
// loads the roles.
//
// Why it exists. client-go's reflector (v0.37.2) waits before each retry with one
// backoff per reflector — 0.8 s doubling to 30 s, jittered up to twice that,
// stepped on every failed watch request and every time its list-and-watch ends (a
// 410 included), reset only after two minutes — and SharedIndexInformer does not let
// a caller set it: ReflectorOptions.Backoff exists, but
// cache.SharedIndexInformerOptions has no field for it and the informer's controller
// builds its reflector without it (tools/cache/controller.go, RunWithContext; the
// field's own comment: "TODO(#136943): Expose this configuration through
// SharedInformerFactory"). After two or three apiserver restarts an informer waited
// 10–30 s after the apiserver was back. NewListWatch never hands the reflector an
// error the apiserver's return will cure: it retries failed requests itself (100 ms
// rising to 500 ms), reopens ended watches from the last resourceVersion it
// delivered, and after a 410 lists again in place — in pages, after a random wait
// that grows with the objects it holds, so agents relisting at once spread —
// delivering the difference as events page by page (listWatch.diffPage: an
// unchanged object as the object delivered before, so the informer's cache, and what
// internal/translate's NodeLocal keeps, stay that object; one decoded page held at
// a time, not the whole list).
//
// When it can be deleted. When client-go passes a reflector backoff through the
// informer — a `Backoff *wait.Backoff` in cache.SharedIndexInformerOptions (and
// cache.Config) handed to NewReflectorWithOptions in controller.RunWithContext,
// kubernetes/kubernetes#136943 — the agent can set 100 ms capped at 500 ms there and
// use cache.NewListWatchFromClient with NewLister as its ListWithContextFunc and
// NewWatcher as its WatchFuncWithContext: the
// retry and reopen loops (listWatch.retry, resilientWatch) go. The in-place relist
// after a 410 (resilientWatch.relist) goes with them; the reflector's own relist
// then caches new decodes, so versions kept without rules hold their old object
// until the object's next write (memory, not correctness: translate/nodelocal.go),
// and, where it lists instead of streaming (WatchList off), joins every page before
// its store sees any (the whole decoded list at once: BENCHMARKS.md "Peak memory
// across an in-place relist").
// NewLister, NewWatcher and Health stay: the first two are plain functions
// client-go's ListWatch accepts today; the third is observation.
//
// It imports client-go and report; the agent's types come in as a scheme.
package kubewatch
