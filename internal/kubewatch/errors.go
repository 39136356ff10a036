package kubewatch

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"
)

// Failures of a reflector's list or watch closer together than failureStreakGap are
// one streak; a streak older than failurePersistent is persistent. client-go's
// reflector retries with a backoff of 0.8 s doubling to 30 s, so a persistent
// failure is seen again within a minute of its start.
const (
	failureStreakGap  = 2 * time.Minute
	failurePersistent = 30 * time.Second
)

// ErrorHandler is a reflector error handler (SharedIndexInformer's
// SetWatchErrorHandlerWithContext) that tells a failure the retry cures from one
// that persists. client-go's default logs every failed list or watch at ERROR, and
// some cure themselves within a second: an apiserver that has just restarted answers
// 403 until its RBAC authorizer has loaded its roles ("clusterrole ... not found"),
// seen on agents around every apiserver restart. So a failure is logged at WARN,
// and at ERROR once its streak has lasted failurePersistent; persistent is then
// called once per streak, with the error (nil: nothing more to do). Expired
// resourceVersions and ended streams are the reflector's ordinary relists, logged at
// debug as client-go does.
type ErrorHandler struct {
	log        *slog.Logger
	resource   string
	persistent func(error)
	now        func() time.Time

	mu          sync.Mutex
	since, last time.Time
	reported    bool
}

// NewErrorHandler returns resource's reflector error handler logging to log; see
// ErrorHandler. persistent may be nil.
func NewErrorHandler(log *slog.Logger, resource string, persistent func(error)) *ErrorHandler {
	return &ErrorHandler{log: log, resource: resource, persistent: persistent, now: time.Now}
}

// Handle is the cache.WatchErrorHandlerWithContext.
func (h *ErrorHandler) Handle(_ context.Context, _ *cache.Reflector, err error) {
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		h.log.Debug("watch ended: the reflector lists again", "resource", h.resource, "err", err)
		return
	}
	h.mu.Lock()
	now := h.now()
	if h.since.IsZero() || now.Sub(h.last) > failureStreakGap {
		h.since, h.reported = now, false
	}
	h.last = now
	lasted := now.Sub(h.since)
	report := lasted >= failurePersistent && !h.reported
	if report {
		h.reported = true
	}
	h.mu.Unlock()
	if lasted < failurePersistent {
		h.log.Warn("apiserver refused or failed a list or watch: client-go retries it", "resource", h.resource, "err", err)
		return
	}
	h.log.Error("apiserver keeps refusing or failing a list or watch: client-go retries it", "resource", h.resource,
		"failingFor", lasted.Round(time.Second), "err", err)
	if report && h.persistent != nil {
		h.persistent(err)
	}
}
