package deploy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/npagent/npagent/api/v1alpha1"
	"github.com/npagent/npagent/internal/testenv"
)

// readManifests decodes every YAML document of the files, in order.
func readManifests(t *testing.T, files ...string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(u.Object) > 0 {
				objs = append(objs, u)
			}
		}
	}
	return objs
}

// TestManifestsApplyAndRBACGrantsWhatTheAgentNeeds creates every object of the
// manifests in a real apiserver that has the controller's own CRDs, as a cluster does
// (the kit brings none), and validates them, the DaemonSet's pod template included.
// Then it acts as the agent's service account: it may list and watch both kinds in
// every namespace, and may not write them or read Secrets.
func TestManifestsApplyAndRBACGrantsWhatTheAgentNeeds(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs kube-apiserver and etcd")
	}
	cp := testenv.Start(t, testenv.WithCRDDir(testenv.UpstreamCRDDir(t)))
	ctx := context.Background()

	objs := readManifests(t, "rbac.yaml", "daemonset.yaml")
	kinds := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			t.Errorf("the manifests hold the CRD %s: the controller installs the CRDs, the kit must not replace them", o.GetName())
		}
		if err := cp.Client.Create(ctx, o); err != nil {
			t.Fatalf("create %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
		kinds[o.GetKind()] = true
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"} {
		if !kinds[k] {
			t.Errorf("the manifests hold no %s", k)
		}
	}

	agentConfig := rest.CopyConfig(cp.Config)
	agentConfig.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:npagent:npagent"}
	agent, err := client.NewWithWatch(agentConfig, client.Options{Scheme: cp.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.List(ctx, &v1alpha1.PolicyEndpointList{}); err != nil {
		t.Errorf("service account cannot list PolicyEndpoints in all namespaces: %v", err)
	}
	if err := agent.List(ctx, &v1alpha1.ClusterPolicyEndpointList{}); err != nil {
		t.Errorf("service account cannot list ClusterPolicyEndpoints: %v", err)
	}
	w, err := agent.Watch(ctx, &v1alpha1.PolicyEndpointList{})
	if err != nil {
		t.Errorf("service account cannot watch PolicyEndpoints: %v", err)
	} else {
		w.Stop()
	}

	pe := &v1alpha1.PolicyEndpoint{}
	pe.Name, pe.Namespace = "written-by-agent", "default"
	pe.Spec.PolicyRef.Name = "x"
	if err := agent.Create(ctx, pe); !apierrors.IsForbidden(err) {
		t.Errorf("service account create PolicyEndpoint: err = %v, want Forbidden (the agent only reads)", err)
	}
	secrets := &unstructured.UnstructuredList{}
	secrets.SetAPIVersion("v1")
	secrets.SetKind("SecretList")
	if err := agent.List(ctx, secrets); !apierrors.IsForbidden(err) {
		t.Errorf("service account list Secrets: err = %v, want Forbidden", err)
	}
}
