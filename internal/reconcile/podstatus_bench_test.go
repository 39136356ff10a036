package reconcile

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/podcond"
	"github.com/npagent/npagent/internal/testenv"
)

// allRequests counts every request a client sends, and its pods/status patches.
type allRequests struct {
	rt               http.RoundTripper
	requests, writes *atomic.Int64
}

func (c allRequests) RoundTrip(r *http.Request) (*http.Response, error) {
	c.requests.Add(1)
	return statusPatches{rt: c.rt, n: c.writes}.RoundTrip(r)
}

// BenchmarkPodConditionChurn: pods churning on one node (each op: a pod comes with
// an IP, its PolicyEndpoint lists it, its condition turns True, an older pod goes);
// reports the agent's pods/status patches and apiserver requests per pod, and the
// time from the listing to the condition True. -benchtime=100x: 100 pods.
func BenchmarkPodConditionChurn(b *testing.B) {
	cp := testenv.Start(b)
	const node, ns = "192.0.2.55", "churn"
	createNamespace(b, cp, ns)
	resolver := newLookupTableResolver()
	var requests, writes atomic.Int64
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return allRequests{rt: rt, requests: &requests, writes: &writes}
	})
	startAgent(b, cp, agentOptions{nodeIP: node, resolver: resolver, podStatus: true, restConfig: cfg})
	pe := ingressPE(ns, "web", nil, "10.99.0.1/32", 80)
	pe.Spec.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	if err := cp.Client.Create(context.Background(), pe); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var listed []v1alpha1.PodEndpoint
	var toProgrammed time.Duration
	requests.Store(0)
	writes.Store(0)
	b.ResetTimer()
	for i := range b.N {
		name, ip := fmt.Sprintf("web-%d", i), fmt.Sprintf("10.55.%d.%d", i/250, i%250+1)
		resolver.set(ip, 1000+i)
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{NodeName: "node-" + node, Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}}}
		if err := cp.Client.Create(ctx, p); err != nil {
			b.Fatal(err)
		}
		p.Status.PodIP, p.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
		if err := cp.Client.Status().Update(ctx, p); err != nil {
			b.Fatal(err)
		}
		ep := pod(node, ip)
		ep.Name, ep.Namespace = name, ns
		listed = append(listed, ep)
		if len(listed) > 10 { // ten pods live; the oldest goes
			gone := listed[0]
			listed = listed[1:]
			if err := cp.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gone.Name}}, client.GracePeriodSeconds(0)); err != nil {
				b.Fatal(err)
			}
		}
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pe), pe); err != nil {
			b.Fatal(err)
		}
		pe.Spec.PodSelectorEndpoints = append([]v1alpha1.PodEndpoint(nil), listed...)
		start := time.Now()
		if err := cp.Client.Update(ctx, pe); err != nil {
			b.Fatal(err)
		}
		for {
			var got corev1.Pod
			if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(p), &got); err != nil {
				b.Fatal(err)
			}
			if c := findCondition(got.Status.Conditions); c != nil && c.Reason == podcond.ReasonProgrammed {
				break
			}
			if time.Since(start) > 20*time.Second {
				b.Fatalf("pod %s not programmed after 20s", name)
			}
			time.Sleep(5 * time.Millisecond)
		}
		toProgrammed += time.Since(start)
	}
	b.StopTimer()
	b.ReportMetric(float64(writes.Load())/float64(b.N), "patches/pod")
	b.ReportMetric(float64(requests.Load())/float64(b.N), "requests/pod")
	b.ReportMetric(float64(toProgrammed.Milliseconds())/float64(b.N), "ms-listed-to-True/pod")
}

// realisticPod is a pod as the apiserver sends it: labels, annotations, managed
// fields, two containers with probes and env, its conditions and container statuses.
func realisticPod(i int) *corev1.Pod {
	now := metav1.Now()
	c := corev1.Container{Name: "app", Image: "registry.example.com/team/app@sha256:" + fmt.Sprintf("%064d", i),
		Env:            []corev1.EnvVar{{Name: "A", Value: "a"}, {Name: "B", Value: "b"}, {Name: "C", Value: "c"}},
		Ports:          []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready"}}},
		VolumeMounts:   []corev1.VolumeMount{{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}}}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: fmt.Sprintf("app-7d9f8c6b5-%05d", i), UID: "uid",
			Labels:          map[string]string{"app": "app", "pod-template-hash": "7d9f8c6b5", "team": "a"},
			Annotations:     map[string]string{"kubectl.kubernetes.io/restartedAt": now.String()},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager"}, {Manager: "kubelet"}},
			OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "app-7d9f8c6b5"}}},
		Spec:   corev1.PodSpec{NodeName: "node", Containers: []corev1.Container{c, c}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}}, HostIP: "192.0.2.1"},
	}
	for _, t := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled, podcond.Type} {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now, Message: "programmed: PolicyEndpoint team/app-abcde"})
	}
	for range 2 {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: "app", Image: c.Image, ImageID: c.Image, ContainerID: "containerd://" + fmt.Sprintf("%064d", i), Ready: true})
	}
	return p
}

// BenchmarkPodInformerMemory: the heap the pod informer's cache holds for 110 pods
// (a node's default maximum), stripped as the agent keeps them (stripPod) and as
// the apiserver sends them.
func BenchmarkPodInformerMemory(b *testing.B) {
	const pods = 110
	for range b.N {
		for _, strip := range []bool{true, false} {
			store := cache.NewStore(cache.MetaNamespaceKeyFunc)
			before := liveHeap()
			for i := range pods {
				var obj any = realisticPod(i)
				if strip {
					obj, _ = stripPod(obj)
				}
				if err := store.Add(obj); err != nil {
					b.Fatal(err)
				}
			}
			held := liveHeap() - before
			unit := "full-B/pod"
			if strip {
				unit = "stripped-B/pod"
			}
			b.ReportMetric(float64(held)/pods, unit)
			runtime.KeepAlive(store)
		}
	}
}
