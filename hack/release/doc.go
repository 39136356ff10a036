// Command release turns `make image`'s OCI layout into what a user pulls: the chart
// packaged with its default image pointing at that build, the image as one archive,
// and their checksums — and, given a registry, pushes the image index and the chart
// there as OCI artifacts, so `helm install npagent oci://<registry>/charts/npagent
// --version <version>` works.
//
//	go run ./hack/release -version 0.2.0 -image bin/image/oci -repository ghcr.io/npagent/npagent -out bin/release [-push <registry>/<path>]
//
// `make release VERSION=0.2.0` runs `make image` with that version, then this. It
// writes, under -out:
//
//   - npagent-<version>.tgz: deploy/charts/npagent with version and appVersion
//     <version> and image.repository/image.digest set to -repository and the index's
//     digest, so the chart installs exactly the image built (a tag can be moved; a
//     digest cannot);
//   - npagent-<version>-oci.tar: the OCI image layout (linux/amd64 and linux/arm64
//     under one index) as a tar, for `skopeo copy --all oci-archive:...` or
//     `ctr images import`;
//   - SHA256SUMS: `sha256sum -c` checks both.
//
// It refuses a version that is not semantic (Helm charts need one), an image whose
// version label is another version, and an index without both platforms.
//
// With -push, the index goes to <registry>/<path>:<version> (go-containerregistry,
// the docker keychain's credentials) and the chart to oci://<registry>/<path
// without its last element>/charts/npagent:<version> (Helm's registry client).
package main
