//go:build !race

package main

// raceDetector: this test binary runs without the race detector.
const raceDetector = false
