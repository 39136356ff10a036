// Package docs holds the documentation and the tests that keep it true (links,
// commands, the architecture's package table). Its one non-test file, steps.go,
// reads a page's shell steps for those tests and for test/e2enode, which runs the
// local quick start command by command.
package docs
