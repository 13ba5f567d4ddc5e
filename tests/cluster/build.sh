#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from k8s.io/kubernetes at one
# pinned release, as a Go module with the k8s.io/* staging modules pinned by replace directives
# (what projects that import k8s.io/kubernetes do). Everything comes from the Go module proxy;
# the binaries land in a cache outside the repo, built once per machine:
#   tests/cluster/build.sh            -> prints the directory that holds the binaries
# SHOAL_K8S_CACHE overrides the cache root (default ~/.cache/shoal/k8s).
# kubectl is built too: Debian's kubernetes-client is 1.20, far outside kubectl's supported skew
# (one minor) against a 1.37 server (its server-side apply of a Pod and a Service did work here),
# and on these machines /usr/bin/kubectl belongs to another package (dpkg would refuse to
# overwrite it), so Debian's is not installed.
set -euo pipefail
K8S_VERSION=1.37.2
STAGING_VERSION=0.37.2
CACHE="${SHOAL_K8S_CACHE:-$HOME/.cache/shoal/k8s}/v$K8S_VERSION"
BIN="$CACHE/bin"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl)

have_all() { for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || return 1; done; }
if have_all; then echo "$BIN"; exit 0; fi

mkdir -p "$CACHE/mod" "$BIN"
cd "$CACHE/mod"
STAGING=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
         cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api
         cri-client cri-streaming csi-translation-lib dynamic-resource-allocation endpointslice externaljwt
         kms kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics
         mount-utils pod-security-admission sample-apiserver sample-cli-plugin sample-controller streaming)
{
    echo "module shoal.dev/k8sbuild"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes v$K8S_VERSION"
    echo
    echo "replace ("
    for m in "${STAGING[@]}"; do echo "	k8s.io/$m => k8s.io/$m v$STAGING_VERSION"; done
    echo ")"
} > go.mod
cat > tools.go <<'GO'
//go:build tools

package k8sbuild

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
export GOFLAGS=-mod=mod CGO_ENABLED=0
go mod tidy >&2
for b in "${BINARIES[@]}"; do
    [ -x "$BIN/$b" ] && continue   # built before: only the missing ones
    go build -trimpath -o "$BIN/$b" "k8s.io/kubernetes/cmd/$b" >&2
done
have_all
echo "$BIN"
