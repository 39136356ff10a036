package reconcile

import (
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/npagent/npagent/api/v1alpha1"
)

// The traceparent a version carries: the KEP-5915 key first, then the
// configured key (the AWS one by default, or another).
func TestVersionTraceParentPrecedence(t *testing.T) {
	const (
		kep    = "00-11111111111111111111111111111111-1111111111111111-01"
		aws    = "00-22222222222222222222222222222222-2222222222222222-01"
		custom = "00-33333333333333333333333333333333-3333333333333333-01"
	)
	for _, tc := range []struct {
		name string
		key  string // configured key
		ann  map[string]string
		want string
	}{
		{"kep only", v1alpha1.AnnotationTraceParent, map[string]string{TracingTraceParentAnnotation: kep}, kep},
		{"configured only", v1alpha1.AnnotationTraceParent, map[string]string{v1alpha1.AnnotationTraceParent: aws}, aws},
		{"both: kep wins", v1alpha1.AnnotationTraceParent,
			map[string]string{TracingTraceParentAnnotation: kep, v1alpha1.AnnotationTraceParent: aws}, kep},
		{"kep empty: configured", v1alpha1.AnnotationTraceParent,
			map[string]string{TracingTraceParentAnnotation: "", v1alpha1.AnnotationTraceParent: aws}, aws},
		{"kep invalid still wins", v1alpha1.AnnotationTraceParent,
			map[string]string{TracingTraceParentAnnotation: "garbage", v1alpha1.AnnotationTraceParent: aws}, "garbage"},
		{"custom key", "example.com/tp", map[string]string{"example.com/tp": custom, v1alpha1.AnnotationTraceParent: aws}, custom},
		{"custom key and kep", "example.com/tp", map[string]string{"example.com/tp": custom, TracingTraceParentAnnotation: kep}, kep},
		{"configured is the kep key", TracingTraceParentAnnotation, map[string]string{TracingTraceParentAnnotation: kep}, kep},
		{"none", v1alpha1.AnnotationTraceParent, map[string]string{"other": aws}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var vt versionTable
			vt.init(v1alpha1.AnnotationLastChangeTriggerTime, tc.key, netip.MustParseAddr("192.0.2.1"))
			m := &metav1.ObjectMeta{UID: "uid-1", ResourceVersion: "7", Annotations: tc.ann}
			v, fresh := vt.record(m)
			if !fresh || v.traceParent != tc.want {
				t.Errorf("traceParent %q (fresh %v), want %q", v.traceParent, fresh, tc.want)
			}
			if again, fresh := vt.record(m); fresh || again.traceParent != tc.want {
				t.Errorf("re-delivery: traceParent %q (fresh %v), want %q from the table", again.traceParent, fresh, tc.want)
			}
		})
	}
}
