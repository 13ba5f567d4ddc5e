# Quick start: `make demo` runs the main job, `make test` passes the tests.
# Both make their own .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test demo bench clean

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

demo: venv
	$(PY) -m deploy.cli demo

bench: venv
	$(PY) -m loadtests.bench.replica

clean:
	rm -rf $(VENV) .shoal .pytest_cache
