package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err))
}

// exitCode maps run's result to the process status: 0 for success and --help,
// 2 for a bad command line, the subcommand's code for an exitError, 1 for
// everything else. The error is printed here, unless run logged it.
func exitCode(err error) int {
	var usage usageError
	var exit exitError
	var logged loggedError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.As(err, &logged): // in the agent's log format
		return logged.code
	case errors.As(err, &exit): // the explain and wait subcommands
		if exit.err != nil {
			fmt.Fprintf(os.Stderr, "npagent: %v\n", exit.err)
		}
		return exit.code
	case errors.As(err, &usage):
		fmt.Fprintf(os.Stderr, "npagent: %v\nRun npagent --help for the flags.\n", err)
		return 2
	default:
		fmt.Fprintf(os.Stderr, "npagent: %v\n", err)
		return 1
	}
}
