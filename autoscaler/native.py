"""Pure modules of Shoal compiled by mypyc at first use, from their source as it is now.

The simulator's scale run makes millions of looks of `autoscaler.policy.decide()`; the same
source compiled by mypyc runs them several times faster, so there is one `decide()` and no
second copy of its arithmetic. `load("autoscaler.policy")` builds the module once into a
cache keyed by a hash of its source, of the project sources it imports (their types are
compiled in), of the compiler's version and of the Python it runs on, and loads it under a
name of its own (`shoal_policy_<key>`), beside the interpreted module: an edited source has
another key, so a stale build is never loaded. Without mypyc or a C compiler it raises
`CompileError` saying why, and the caller keeps the interpreted module.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import ModuleType

BUILD_TIMEOUT_S = 600.0
_loaded: dict[str, ModuleType] = {}


class CompileError(RuntimeError):
    """The module could not be compiled or loaded; the message says why."""


def cache_dir() -> Path:
    """$SHOAL_COMPILE_CACHE, else $XDG_CACHE_HOME/shoal/compiled (~/.cache/shoal/compiled)."""
    if os.environ.get("SHOAL_COMPILE_CACHE"):
        return Path(os.environ["SHOAL_COMPILE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "shoal" / "compiled"


def load(module: str) -> ModuleType:
    """`module` compiled, built first if its cache has no build of this exact source."""
    if module in _loaded:
        return _loaded[module]
    root, sources = _sources(module)
    name = f"shoal_{module.rsplit('.', 1)[-1]}_{_key(sources)}"
    try:
        built = _find(cache_dir(), name) or _build(module, root, name)
    except OSError as error:  # an unwritable cache, a full disk
        raise CompileError(f"building {module} in {cache_dir()}: {error}") from error
    spec = importlib.util.spec_from_file_location(name, built)
    if spec is None or spec.loader is None:
        raise CompileError(f"{built} is not a loadable extension module")
    compiled = importlib.util.module_from_spec(spec)
    sys.modules[name] = compiled  # the classes it defines name it as their module
    try:
        spec.loader.exec_module(compiled)
    except Exception as error:
        del sys.modules[name]
        raise CompileError(f"loading {built}: {error}") from error
    _loaded[module] = compiled
    return compiled


def _sources(module: str) -> tuple[Path, dict[str, bytes]]:
    """The project's root folder, and the source of `module` and of every project module it
    imports, directly or not, by module name."""
    found = importlib.util.find_spec(module)
    if found is None or found.origin is None:
        raise CompileError(f"no source for {module}")
    root = Path(found.origin).parents[module.count(".")]
    sources: dict[str, bytes] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        path = root.joinpath(*name.split(".")).with_suffix(".py")
        if name in sources or not path.is_file():
            continue  # not the project's (the standard library's, a dependency's)
        sources[name] = path.read_bytes()
        for node in ast.walk(ast.parse(sources[name])):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                todo.append(node.module)
            elif isinstance(node, ast.Import):
                todo.extend(alias.name for alias in node.names)
    return root, sources


def _key(sources: dict[str, bytes]) -> str:
    try:
        from mypy.version import __version__ as mypy_version
    except ImportError as error:
        raise CompileError("mypyc is not installed (pip install mypy)") from error
    digest = hashlib.sha256(f"{mypy_version} {sys.version} {platform.machine()}".encode())
    for name in sorted(sources):
        digest.update(name.encode() + b"\0" + sources[name] + b"\0")
    return digest.hexdigest()[:16]


def _find(folder: Path, name: str) -> Path | None:
    for suffix in EXTENSION_SUFFIXES:
        if (folder / (name + suffix)).is_file():
            return folder / (name + suffix)
    return None


def _build(module: str, root: Path, name: str) -> Path:
    """mypyc on a copy of the module's source named `name`, type-checked against the project
    at `root`; the extension moved into the cache at once (os.replace), so that processes
    building the same key side by side each load a whole file."""
    folder = cache_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # it holds code this process loads
    source = root.joinpath(*module.split(".")).with_suffix(".py").read_bytes()
    with tempfile.TemporaryDirectory(dir=folder) as work:
        Path(work, name + ".py").write_bytes(source)
        env = {**os.environ, "MYPYPATH": str(root)}
        try:
            done = subprocess.run([sys.executable, "-m", "mypyc", name + ".py"], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise CompileError(f"mypyc on {module}: {error}") from error
        built = _find(Path(work), name)
        if done.returncode != 0 or built is None:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
            raise CompileError(f"mypyc on {module} failed (exit {done.returncode}):\n{tail}")
        target = folder / built.name
        os.replace(built, target)
    return target
