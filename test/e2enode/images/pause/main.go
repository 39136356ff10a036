// Command pause is the pod sandbox's process on make e2e-node's node: it holds the
// pod's namespaces, reaps the zombies a shared PID namespace leaves to it and exits on
// SIGINT or SIGTERM — what registry.k8s.io/pause does, built here so the node needs no
// registry. pack puts it in an image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
