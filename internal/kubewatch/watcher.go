package kubewatch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// NewWatcher returns a watch request for resource, whose types scheme holds, that
// decodes each event in one pass; rc is a REST client made by NewRESTClient.
// client-go's watch decodes an event three times over: the envelope
// (metav1.WatchEvent, after the JSON serializer's apiVersion/kind probe of the whole
// event, which has none), then the object's raw bytes again with its own probe —
// 97 µs of a PolicyEndpoint event's ~100 µs (BenchmarkWatchEvent). Here each event
// is unmarshalled once, straight into the type newObject returns, with the
// serializer's JSON settings, and kept when its type is one of the four object
// events and its apiVersion/kind are newObject's; anything else (an ERROR event's
// Status, another kind, an unknown type) is decoded as client-go does, with its
// errors. There is no extension point for this: client-go's watch decoder
// (rest/watch.Decoder) always decodes the envelope's raw object again. So the request
// is client-go's own (Stream, not rate limited, as its Watch is not) and the
// answer is read by client-go's StreamWatcher through this decoder.
func NewWatcher(rc rest.Interface, scheme *runtime.Scheme, resource string, newObject func() runtime.Object) (cache.WatchFuncWithContext, error) {
	kinds, _, err := scheme.ObjectKinds(newObject())
	if err != nil {
		return nil, fmt.Errorf("kubewatch: watch of %s: %w", resource, err)
	}
	objects, envelopes, _, err := runtime.NewClientNegotiator(serializer.NewCodecFactory(scheme).WithoutConversion(), schema.GroupVersion{}).
		StreamDecoder(runtime.ContentTypeJSON, nil)
	if err != nil {
		return nil, fmt.Errorf("kubewatch: watch of %s: %w", resource, err)
	}
	kind := kinds[0]
	return func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
		opts.Watch = true
		body, err := rc.Get().Namespace(metav1.NamespaceAll).Resource(resource).
			VersionedParams(&opts, metav1.ParameterCodec).Throttle(nil).Stream(ctx)
		if err != nil {
			return nil, err
		}
		d := &eventDecoder{kind: kind, newObject: newObject, envelopes: envelopes, objects: objects}
		return watch.NewStreamWatcher(&eventStream{body: body, r: bufio.NewReaderSize(body, 64<<10), d: d},
			// as client-go's watch reports an event it cannot decode
			apierrors.NewClientErrorReporter(http.StatusInternalServerError, http.MethodGet, "ClientWatchDecoding")), nil
	}, nil
}

// eventStream is the watch.Decoder of one watch. It frames events by line: the
// apiserver's JSON encoder ends each event with a newline, and JSON escapes every
// newline inside a string, so a line is an event. Finding the newline is a memchr,
// where client-go's JSON framer scans each event twice (encoding/json's Decoder into
// a RawMessage) before it is decoded: a third of the time left. A line that is not a
// whole event (pretty-printed JSON) is joined with the lines after it until it is.
type eventStream struct {
	body io.ReadCloser
	r    *bufio.Reader
	buf  []byte // an event longer than r's buffer, or spread over lines
	last []byte // the line last returned in place (in r's buffer)
	d    *eventDecoder
}

// maxEventBytes bounds one event, as client-go's streaming decoder does.
const maxEventBytes = 16 << 20

// eventDecoder decodes one frame, an event (runtime.Decoder).
type eventDecoder struct {
	kind      schema.GroupVersionKind
	newObject func() runtime.Object
	envelopes runtime.Decoder // client-go's: the envelope
	objects   runtime.Decoder // client-go's: the envelope's object
}

var (
	_ watch.Decoder   = (*eventStream)(nil)
	_ runtime.Decoder = (*eventDecoder)(nil)
)

// leanEvent is a watch event's envelope with its object typed: Object holds the
// pointer newObject returned, which the unmarshal fills in place.
type leanEvent struct {
	Type   watch.EventType `json:"type"`
	Object any             `json:"object"`
}

// Decode returns the next event of the stream (watch.Decoder).
func (s *eventStream) Decode() (watch.EventType, runtime.Object, error) {
	var got metav1.WatchEvent
	line, err := s.line(false)
	for err == nil {
		_, _, err = s.d.Decode(line, nil, &got)
		if err == nil {
			return watch.EventType(got.Type), got.Object.Object, nil
		}
		if json.Valid(line) {
			return "", nil, err // a whole event that does not decode: client-go's error
		}
		line, err = s.line(true)
	}
	return "", nil, err
}

// line returns the next non-blank line, or with more, the lines so far and the next
// one. It is valid until the next call.
func (s *eventStream) line(more bool) ([]byte, error) {
	switch {
	case !more:
		s.buf = s.buf[:0]
	case len(s.buf) == 0: // the lines so far were read in place: keep them before reading on
		s.buf = append(s.buf, s.last...)
	}
	for {
		part, err := s.r.ReadSlice('\n')
		switch {
		case err == nil && len(s.buf) == 0 && len(bytes.TrimSpace(part)) > 0:
			s.last = part
			return part, nil // the common case: a whole event, read in place
		case err == nil || errors.Is(err, bufio.ErrBufferFull):
			if len(s.buf)+len(part) > maxEventBytes {
				return nil, streaming.ErrObjectTooLarge
			}
			s.buf = append(s.buf, part...)
			if err == nil && len(bytes.TrimSpace(s.buf)) > 0 {
				return s.buf, nil
			}
		case errors.Is(err, io.EOF):
			if len(bytes.TrimSpace(part)) > 0 { // the last line, without its newline
				s.buf = append(s.buf, part...)
				return s.buf, nil
			}
			if len(bytes.TrimSpace(s.buf)) > 0 {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, io.EOF
		default:
			return nil, err
		}
	}
}

// Close closes the stream (watch.Decoder).
func (s *eventStream) Close() { _ = s.body.Close() }

// Decode decodes one frame, an event, into into, a *metav1.WatchEvent: its Type, and
// the object decoded in Object.Object (runtime.Decoder, for the frame reader).
func (d *eventDecoder) Decode(data []byte, _ *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	got := into.(*metav1.WatchEvent)
	obj := d.newObject()
	ev := leanEvent{Object: obj}
	if utiljson.Unmarshal(data, &ev) == nil && obj.GetObjectKind().GroupVersionKind() == d.kind {
		switch ev.Type {
		case watch.Added, watch.Modified, watch.Deleted, watch.Bookmark:
			obj.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{}) // as the REST client's decoder leaves it
			got.Type, got.Object.Object = string(ev.Type), obj
			return got, nil, nil
		}
	}
	return d.slow(data, got)
}

// slow decodes an event as client-go's watch decoder (rest/watch.Decoder) does.
func (d *eventDecoder) slow(data []byte, got *metav1.WatchEvent) (runtime.Object, *schema.GroupVersionKind, error) {
	var env metav1.WatchEvent
	res, _, err := d.envelopes.Decode(data, nil, &env)
	if err != nil {
		return nil, nil, err
	}
	if res != &env {
		return nil, nil, fmt.Errorf("unable to decode to metav1.WatchEvent")
	}
	switch watch.EventType(env.Type) {
	case watch.Added, watch.Modified, watch.Deleted, watch.Error, watch.Bookmark:
	default:
		return nil, nil, fmt.Errorf("got invalid watch event type: %v", env.Type)
	}
	obj, err := runtime.Decode(d.objects, env.Object.Raw)
	if err != nil {
		return nil, nil, fmt.Errorf("unable to decode watch event: %v", err)
	}
	got.Type, got.Object.Object = env.Type, obj
	return got, nil, nil
}
