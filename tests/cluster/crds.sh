#!/usr/bin/env bash
# Fetch the CRDs that Shoal's rendered manifests need from the Go module proxy, the packages that
# ship them, into the cache outside the repo (once per machine):
#   tests/cluster/crds.sh     -> prints the directory with the CRD YAMLs
# ServiceMonitor and PrometheusRule: github.com/prometheus-operator/prometheus-operator's
# example/prometheus-operator-crd/. InferenceService: github.com/kserve/kserve's config/crd/full/.
# kserve is pinned at v0.20.0: the proxy answers 403 for v0.21.0 (the SDK's version) and @latest.
set -euo pipefail
PROM_VERSION=v0.85.0
KSERVE_VERSION=v0.20.0
OUT="${SHOAL_K8S_CACHE:-$HOME/.cache/shoal/k8s}/crds"
FILES=(monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_prometheusrules.yaml
       serving.kserve.io_inferenceservices.yaml)
have_all() { for f in "${FILES[@]}"; do [ -s "$OUT/$f" ] || return 1; done; }
if have_all; then echo "$OUT"; exit 0; fi
mkdir -p "$OUT"
dir_of() { GOFLAGS=-mod=mod go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'; }
cd "$OUT"
PROM="$(dir_of github.com/prometheus-operator/prometheus-operator@$PROM_VERSION)"
KSERVE="$(dir_of github.com/kserve/kserve@$KSERVE_VERSION)"
cp "$PROM/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" \
   "$PROM/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml" \
   "$KSERVE/config/crd/full/serving.kserve.io_inferenceservices.yaml" .
chmod 644 ./*.yaml
have_all
echo "$OUT"
