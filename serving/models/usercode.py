"""Loading a user's Python file as a module (Nuclio handlers, KServe custom models)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

from serving.models.base import LoadError


def load_module(path: str, name: str) -> types.ModuleType:
    """Import `path` as module `shoal_user_<name>`; its folder joins sys.path so that
    the file's own sibling imports work, as they would for `python file.py`."""
    file = Path(path).resolve()
    module_name = f"shoal_user_{name.replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise LoadError(f"{path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise LoadError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module
