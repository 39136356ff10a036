//go:build tools

// Package tools pins Jaeger v2 (all-in-one, memory storage) for npagent's demo. It has
// a module of its own because Jaeger pins a collector release that cannot share a
// go.mod with the one npagent's collector build uses. Built by hack/tools.sh.
package tools

import _ "github.com/jaegertracing/jaeger/cmd/jaeger"
