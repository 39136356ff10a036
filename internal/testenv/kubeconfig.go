package testenv

import (
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// WriteKubeconfig writes a kubeconfig file reaching rc's apiserver with rc's
// credentials, as an operator would hand a program (the agent, the churn driver)
// its --kubeconfig.
func WriteKubeconfig(tb testing.TB, rc *rest.Config, path string) {
	tb.Helper()
	server := rc.Host
	if !strings.Contains(server, "://") {
		server = "https://" + server
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: rc.CAData, InsecureSkipTLSVerify: rc.Insecure,
		TLSServerName: rc.ServerName}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData,
		Token: rc.BearerToken, Username: rc.Username, Password: rc.Password,
	}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		tb.Fatalf("write kubeconfig %s: %v", path, err)
	}
}
