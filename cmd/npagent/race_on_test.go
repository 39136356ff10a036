//go:build race

package main

// raceDetector: this test binary runs under the race detector, which slows every
// goroutine several-fold and makes sub-millisecond timing meaningless.
const raceDetector = true
