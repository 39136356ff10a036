//go:build race

package telemetry

// raceEnabled: under the race detector sync.Pool drops a share of what is put
// back, so pooled scratch is allocated again now and then.
const raceEnabled = true
