package testenv

import (
	"context"
	"sync"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CreateEach creates object(0) … object(n-1) through c, eight requests at a time
// (a benchmark's thousands of objects in seconds, not minutes), and fails tb with
// the first error. object is called from several goroutines at once.
func CreateEach(tb testing.TB, c client.Client, n int, object func(i int) client.Object) {
	tb.Helper()
	const workers = 8
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				if err := c.Create(context.Background(), object(i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		tb.Fatal(err)
	}
}
