"""Artifact loaders, and which one an artifact needs: detection reads the file name and, for Python
files, the syntax tree (no code runs), and `--loader` overrides it. Loader modules are imported
lazily, so a replica pays only for the framework its model needs.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from serving.models.base import LoadError, LoadOptions, Model

LOADERS: dict[str, str] = {
    "onnx": "serving.models.onnx:OnnxModel",
    "torchscript": "serving.models.torchscript:TorchScriptModel",
    "sklearn": "serving.models.sklearn:SklearnModel",
    "handler": "serving.models.handler:HandlerModel",
    "kserve": "serving.models.kserve_custom:KServeModel",
    "profile": "serving.models.profile:ProfileModel",
}

_SUFFIXES = {
    ".onnx": "onnx",
    ".pt": "torchscript",
    ".pth": "torchscript",
    ".torchscript": "torchscript",
    ".joblib": "sklearn",
    ".pkl": "sklearn",
    ".pickle": "sklearn",
    ".yaml": "profile",
    ".yml": "profile",
}


def detect_loader(path: str) -> str:
    """The loader an artifact needs, from its name (and a .py file's syntax tree)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".py":
        return _detect_python(p)
    try:
        return _SUFFIXES[suffix]
    except KeyError:
        raise LoadError(
            f"cannot tell how to load {p.name!r} from its suffix {suffix!r}: expected one of "
            f"{', '.join(sorted(_SUFFIXES) + ['.py'])}, or pass --loader {{{','.join(LOADERS)}}}"
        ) from None


def _detect_python(p: Path) -> str:
    try:
        tree = ast.parse(p.read_text(encoding="utf-8"), filename=str(p))
    except (SyntaxError, UnicodeDecodeError) as exc:
        raise LoadError(f"{p} is not valid Python: {exc}") from None
    imports_kserve = any(
        (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "kserve" for a in n.names))
        or (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "kserve")
        for n in ast.walk(tree)
    )
    has_model_class = any(
        isinstance(n, ast.ClassDef) and any(_base_name(b) == "Model" for b in n.bases) for n in tree.body
    )
    if imports_kserve and has_model_class:
        return "kserve"
    if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "handler" for n in tree.body):
        return "handler"
    raise LoadError(f"{p} defines neither handler(context, event) nor a kserve.Model subclass")


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def model_class(loader: str) -> type[Model]:
    try:
        module_name, _, cls = LOADERS[loader].partition(":")
    except KeyError:
        raise LoadError(f"unknown loader {loader!r}; expected one of {', '.join(LOADERS)}") from None
    return getattr(importlib.import_module(module_name), cls)


def create_model(path: str, name: str, loader: str | None, options: LoadOptions) -> Model:
    """The model object for an artifact (not loaded yet: call load() on the executor)."""
    if not Path(path).is_file():
        raise LoadError(f"artifact {path!r} does not exist or is not a file")
    chosen = loader or detect_loader(path)
    return model_class(chosen)(name, path, options)


__all__ = ["LoadError", "LoadOptions", "Model", "create_model", "detect_loader", "LOADERS"]
