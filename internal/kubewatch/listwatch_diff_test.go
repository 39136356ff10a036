package kubewatch

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/npagent/npagent/api/v1alpha1"
)

// TestListWatchDiffKeepsDeliveredObject: the in-place relist after a 410 re-delivers
// an unchanged object (same uid and resourceVersion) as the very object delivered
// before, not as the new decode, and a changed one as a copy of its own, not as an
// item of the new list. translate.Options.NodeLocal relies on it: the versions the
// pod table keeps without rules refer to the informer's cached object, which must
// stay that object and must not hold a whole list alive.
func TestListWatchDiffKeepsDeliveredObject(t *testing.T) {
	pe := func(name, uid, rv string) *v1alpha1.PolicyEndpoint {
		return &v1alpha1.PolicyEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID("u-" + uid), ResourceVersion: rv}}
	}
	same, changed := pe("same", "1", "5"), pe("changed", "2", "5")
	var l listWatch
	l.listed([]runtime.Object{same, changed}, true)

	// The list after the 410: every item a new decode.
	relisted := []runtime.Object{pe("same", "1", "5"), pe("changed", "2", "6")}
	events, _ := l.diff(relisted)
	if len(events) != 2 {
		t.Fatalf("events = %v, want two modifications", events)
	}
	for _, ev := range events {
		if ev.Type != watch.Modified {
			t.Errorf("%v event, want Modified", ev.Type)
		}
		switch got := ev.Object.(*v1alpha1.PolicyEndpoint); got.Name {
		case "same":
			if got != same {
				t.Error("an unchanged object is re-delivered as the new decode, not as the object delivered before")
			}
		case "changed":
			if got == relisted[1] || got == changed || got.ResourceVersion != "6" {
				t.Errorf("a changed object is re-delivered as %p (list item %p, old %p), resourceVersion %s: want a copy of the new version",
					got, relisted[1], changed, got.ResourceVersion)
			}
		}
	}
}

// diff is an in-place relist whose list is one page, items: the events that turn
// what was delivered into items, and the unchanged objects, for the observer.
func (l *listWatch) diff(items []runtime.Object) (events []watch.Event, unchanged []runtime.Object) {
	pass := l.newPass()
	events, unchanged = l.diffPage(items, pass, pass)
	return append(events, l.deleteUnlisted(pass)...), unchanged
}
