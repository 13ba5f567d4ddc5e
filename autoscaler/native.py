"""Pure modules of Shoal compiled by mypyc at first use, from their source as it is now.

The simulator's scale run makes millions of looks of `autoscaler.policy.decide()`; the same
source compiled by mypyc runs them several times faster, so there is one `decide()` and no
second copy of its arithmetic. `load_group(POLICY_GROUP)` (or `load` of one module) builds the
modules once into a cache keyed by a hash of the group, of their source, of the project sources they import
(their types are compiled in), of the compiler's version and of the Python it runs on, and loads it under a
name of its own (`shoal_policy_<key>`), beside the interpreted module: an edited source has
another key, so a stale build is never loaded. A group is compiled as one (the modules' imports
of each other renamed to the group's names), so that calls between them are native C calls and
their classes native objects. Without mypyc or a C compiler it raises `CompileError` saying why, and
the caller keeps the interpreted modules.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import platform
import re
import stat
import subprocess
import sys
import tempfile
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import ModuleType

BUILD_TIMEOUT_S = 600.0
# decide() with the records one look builds and reads, the function's ScalingSpec and the tick's
# looks, in import order: one mypyc group, so that a look is native calls and native objects throughout
POLICY_GROUP = ("autoscaler.record", "functions.spec", "autoscaler.snapshot", "autoscaler.policy", "autoscaler.looks")
_loaded: dict[tuple[str, ...], tuple[ModuleType, ...]] = {}


class CompileError(RuntimeError):
    """The module could not be compiled or loaded; the message says why."""


def cache_dir() -> Path:
    """$SHOAL_COMPILE_CACHE, else $XDG_CACHE_HOME/shoal/compiled (~/.cache/shoal/compiled)."""
    if os.environ.get("SHOAL_COMPILE_CACHE"):
        return Path(os.environ["SHOAL_COMPILE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "shoal" / "compiled"


def load(module: str) -> ModuleType:
    """`module` compiled, built first if its cache has no build of this exact source."""
    return load_group((module,))[0]


def load_group(modules: tuple[str, ...]) -> tuple[ModuleType, ...]:
    """`modules` compiled in one mypyc group, in that order (a module after those it imports),
    built first if the cache has no build of these exact sources. E.g. ("autoscaler.policy",
    "autoscaler.looks") -> (shoal_policy_<key>, shoal_looks_<key>), the second calling the
    first's functions natively."""
    if modules in _loaded:
        return _loaded[modules]
    sources: dict[str, bytes] = {}
    for module in modules:
        sources.update(_sources(module)[1])
    key = _key(modules, sources)
    names = {module: f"shoal_{module.rsplit('.', 1)[-1]}_{key}" for module in modules}
    try:
        folder = _trusted_cache()
        built = [_find(folder, name) for name in names.values()]
        if None in built:
            built = _build(sources, names)
    except OSError as error:  # an unwritable cache, a full disk
        raise CompileError(f"building {', '.join(modules)} in {cache_dir()}: {error}") from error
    sys.path.insert(0, str(cache_dir()))  # where a group's modules find its shared library
    try:
        loaded = tuple(_exec(name, path) for name, path in zip(names.values(), built))
    finally:
        sys.path.remove(str(cache_dir()))
    _loaded[modules] = loaded
    return loaded


def _exec(name: str, built: Path | None) -> ModuleType:
    if name in sys.modules:  # imported already by a module of its group
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, built) if built is not None else None
    if spec is None or spec.loader is None:
        raise CompileError(f"{built} is not a loadable extension module")
    compiled = importlib.util.module_from_spec(spec)
    sys.modules[name] = compiled  # the classes it defines name it as their module
    try:
        spec.loader.exec_module(compiled)
    except Exception as error:
        del sys.modules[name]
        raise CompileError(f"loading {built}: {error}") from error
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
        if not path.is_file():  # a package: its __init__
            path = root.joinpath(*name.split("."), "__init__.py")
        if name in sources or not path.is_file():
            continue  # not the project's (the standard library's, a dependency's)
        sources[name] = path.read_bytes()
        for node in ast.walk(ast.parse(sources[name])):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                todo.append(node.module)
            elif isinstance(node, ast.Import):
                todo.extend(alias.name for alias in node.names)
    return root, sources


def _key(modules: tuple[str, ...], sources: dict[str, bytes]) -> str:
    try:
        from mypy.version import __version__ as mypy_version
    except ImportError as error:
        raise CompileError("mypyc is not installed (pip install mypy)") from error
    # the group too: the same sources grouped otherwise compile to modules that import each other otherwise
    digest = hashlib.sha256(f"{mypy_version} {sys.version} {platform.machine()} {' '.join(modules)}".encode())
    for name in sorted(sources):
        digest.update(name.encode() + b"\0" + sources[name] + b"\0")
    return digest.hexdigest()[:16]


def _trusted_cache() -> Path:
    """The cache folder, made 0700 if new; refused when another user owns it or others may
    write to it, since what is in it is loaded as code."""
    folder = cache_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = folder.stat()
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CompileError(f"{folder} is not this user's alone (owner uid {st.st_uid}, mode "
                           f"{stat.S_IMODE(st.st_mode):o}): nothing in it is loaded")
    return folder


def _write_module(tree: Path, module: str, source: bytes, package: bool) -> None:
    """`module`'s source in `tree` where an import finds it (as its __init__ when it is a
    package), with the __init__ files of the packages above it."""
    parts = module.split(".")
    for depth in range(1, len(parts)):
        init = tree.joinpath(*parts[:depth], "__init__.py")
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_bytes(b"")  # replaced by the package's own source if it is among them
    path = tree.joinpath(*parts, "__init__.py") if package else tree.joinpath(*parts).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(source)


def _find(folder: Path, name: str) -> Path | None:
    for suffix in EXTENSION_SUFFIXES:
        if (folder / (name + suffix)).is_file():
            return folder / (name + suffix)
    return None


def _build(sources: dict[str, bytes], names: dict[str, str]) -> list[Path]:
    """mypyc on copies of the modules' sources, named as in `names` (and importing each other
    by those names), type-checked against the project sources they import; the extensions moved into the
    cache at once (os.replace; a group's shared library first, the modules in order), so that
    processes building the same key side by side each load whole files."""
    folder = _trusted_cache()
    with tempfile.TemporaryDirectory(dir=folder) as work:
        for module, name in names.items():  # the bytes the key was made of, not the file read again
            Path(work, name + ".py").write_bytes(_renamed(module, sources[module], names))
        # what the modules import, type-checked from a tree of its own: an installed shoal's
        # root is site-packages, which mypy refuses as a MYPYPATH
        tree = Path(work, "src")
        for module, source in sources.items():
            package = any(other.startswith(module + ".") for other in sources)
            _write_module(tree, module, source, package)
        env = {**os.environ, "MYPYPATH": str(tree)}
        try:
            done = subprocess.run([sys.executable, "-m", "mypyc", *(name + ".py" for name in names.values())],
                                  cwd=work, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise CompileError(f"mypyc on {', '.join(names)}: {error}") from error
        built = [_find(Path(work), name) for name in names.values()]
        if done.returncode != 0 or None in built:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
            raise CompileError(f"mypyc on {', '.join(names)} failed (exit {done.returncode}):\n{tail}")
        for shared in Path(work).glob("*__mypyc.*"):
            os.replace(shared, folder / shared.name)
        targets = []
        for path in built:
            assert path is not None
            os.replace(path, folder / path.name)
            targets.append(folder / path.name)
    return targets


def _renamed(module: str, source: bytes, names: dict[str, str]) -> bytes:
    """`module`'s source with its imports of the group's modules renamed to the group's names:
    `from autoscaler.policy import decide` -> `from shoal_policy_<key> import decide`. Only that
    form is renamed; any other import of a module of the group is refused."""
    lines = source.decode().splitlines(keepends=True)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module in names and not node.level:
            line = lines[node.lineno - 1]
            renamed = re.sub(rf"^(\s*from\s+){re.escape(node.module)}(\s+import\b)", rf"\g<1>{names[node.module]}\g<2>",
                             line)
            if renamed == line:
                raise CompileError(f"{module}, line {node.lineno}: write 'from {node.module} import ...' on one line")
            lines[node.lineno - 1] = renamed
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imported = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [f"{node.module}.{alias.name}" for alias in node.names]
            if any(name in names for name in imported):
                raise CompileError(f"{module}, line {node.lineno}: import a module of its group as "
                                   f"'from <module> import <names>'")
    return "".join(lines).encode()
