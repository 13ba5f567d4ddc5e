# Quick start: `make demo` runs the main job, `make test` passes the tests.
# Both make their own .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test test-cluster test-gpu demo bench ray-venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# torch 2.13.0 is the CPU build this kind of machine keeps on disk; a bare
	@# "torch" would pull a multi-GB CUDA build. Without it, TorchScript tests skip.
	$(PY) -m pip install -q "torch==2.13.0" || echo "torch 2.13.0 unavailable: TorchScript tests will skip"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

test: venv
	$(PY) -m pytest -q

# Against a real control plane (tests/cluster/up.sh, once per session; down.sh at the end).
# Needs root (the node agent makes network namespaces). The binaries and CRDs are built and
# fetched first, once per machine, so the tests' own timeouts do not include a cold build.
test-cluster: venv
	tests/cluster/build.sh >/dev/null
	tests/cluster/crds.sh >/dev/null
	$(PY) -m pytest -q -m cluster --timeout 600 tests/cluster

# On a machine with an NVIDIA GPU and the torch extra (docs/gpu.md); skipped where NVML finds none.
test-gpu: venv
	$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install -q torch
	$(PY) -m pytest -v -s -m gpu tests/gpu

demo: venv
	$(PY) -m deploy.cli demo

bench: venv
	$(PY) -m loadtests.bench.replica
	$(PY) -m loadtests.bench.gateway

# Ray Serve, a peer for loadtests/bench/gateway.py, in a venv of its own
# (ray[serve] 2.60 wants protobuf 7, which kserve cannot take).
ray-venv: .venv-ray/.installed
.venv-ray/.installed:
	$(PYTHON) -m venv .venv-ray
	.venv-ray/bin/python -m pip install -q "ray[serve]" onnxruntime
	touch $@

clean:
	rm -rf $(VENV) .venv-ray .shoal .pytest_cache
