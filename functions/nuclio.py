"""Nuclio artifacts in (a `.py` handler, a notebook, a `function.yaml`) and out (`shoal export`
writes a Nuclio function.yaml). nuclio-jupyter turns a notebook into handler code (`# nuclio:
ignore` cells skipped, `%nuclio` magics as config); its import pulls `requests`, so it is
imported only when a notebook is converted.
"""

from __future__ import annotations

import base64
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from functions.spec import FunctionSpec, SpecError


@dataclass(frozen=True)
class PreparedArtifact:
    data: bytes
    filename: str
    # what the source says about scaling (Nuclio's minReplicas/maxReplicas), applied unless overridden
    hints: dict[str, Any] = field(default_factory=dict)


def prepare(path: Path | str, name: str) -> PreparedArtifact:
    """What to upload for an artifact: notebooks and function.yaml become a handler .py."""
    path = Path(path)
    if path.suffix == ".ipynb":
        return from_notebook(path, name)
    if path.name in ("function.yaml", "function.yml") or path.name.endswith((".nuclio.yaml", ".function.yaml")):
        return from_function_yaml(path.read_text(encoding="utf-8"), name)
    return PreparedArtifact(path.read_bytes(), path.name)


def from_notebook(path: Path, name: str) -> PreparedArtifact:
    import nuclio  # nuclio-jupyter

    with tempfile.TemporaryDirectory() as out:
        _, config, code = nuclio.build_file(str(path), name=name, output_dir=out)
    handler = (config.get("spec", {}) or {}).get("handler", "")
    if not code or "def handler" not in code and not handler:
        raise SpecError(f"{path.name}: the notebook defines no handler(context, event)")
    return PreparedArtifact(code.encode(), f"{name}.py", _hints(config))


def from_function_yaml(text: str, name: str) -> PreparedArtifact:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"function.yaml is not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("spec"), dict):
        raise SpecError("function.yaml must be a mapping with a 'spec' section (a NuclioFunction)")
    handler = str(doc["spec"].get("handler") or "main:handler")
    if handler.rpartition(":")[2] != "handler":
        raise SpecError(f"function.yaml: spec.handler {handler!r} names a function other than 'handler'; "
                        "Shoal calls handler(context, event)")
    source = (doc["spec"].get("build") or {}).get("functionSourceCode")
    if not source:
        raise SpecError("function.yaml has no spec.build.functionSourceCode: only inline Python functions are supported")
    try:
        code = base64.b64decode(source, validate=True)
    except ValueError:
        raise SpecError("function.yaml: spec.build.functionSourceCode is not valid base64") from None
    return PreparedArtifact(code, f"{name}.py", _hints(doc))


def _hints(config: dict) -> dict[str, Any]:
    spec = (config or {}).get("spec", {}) or {}
    hints = {}
    for key, hint in (("minReplicas", "min_replicas"), ("maxReplicas", "max_replicas")):
        if key in spec:
            try:
                hints[hint] = int(spec[key])
            except (TypeError, ValueError):
                raise SpecError(f"function.yaml: spec.{key} {spec[key]!r} must be an integer") from None
    return hints


def to_function_yaml(spec: FunctionSpec, source: bytes) -> str:
    """A Nuclio function.yaml for a Python handler function (the code inline, as Nuclio's
    dashboard and nuclio-jupyter write it). A GPU slice becomes a GPU limit of 1: Nuclio
    has no fractional GPUs, which is why Shoal exists."""
    doc = {
        "apiVersion": "nuclio.io/v1",
        "kind": "NuclioFunction",
        "metadata": {"name": spec.name, "labels": {"shoal.dev/slice": spec.slice.name.replace("/", "-")}},
        "spec": {
            "runtime": "python:3.11",
            "handler": f"{spec.name.replace('-', '_')}:handler",
            "minReplicas": spec.scaling.min_replicas,
            "maxReplicas": spec.scaling.max_replicas,
            "build": {
                "functionSourceCode": base64.b64encode(source).decode(),
                "commands": [],
                "noBaseImagesPull": True,
            },
            "triggers": {"http": {"kind": "http", "maxWorkers": 1}},
        },
    }
    return yaml.safe_dump(doc, sort_keys=False)
