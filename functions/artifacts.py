"""The content-addressed artifact store: an artifact is stored once under its SHA-256, at
`ROOT/sha256/<first two hex>/<hex>/<file name>` (referenced as `sha256:<hex>/<file name>`), so
the same bytes are never stored or downloaded twice and loaders still see the file's suffix.
Writes stream into a temporary file inside the store, hashed and size-checked, and are renamed
into place: nothing is written outside ROOT, and a file name is a bare name (no folders, no `..`).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from functions.spec import SpecError

FILENAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
REF_RE = re.compile(r"^sha256:(?P<hex>[0-9a-f]{64})/(?P<name>[^/]+)$")
DEFAULT_MAX_ARTIFACT_BYTES = 1024 * 1024 * 1024

SUFFIXES = (".onnx", ".pt", ".pth", ".torchscript", ".joblib", ".pkl", ".pickle", ".py", ".yaml", ".yml", ".ipynb")


class ArtifactError(SpecError):
    """An artifact was refused; the message says why."""


class ArtifactTooLarge(ArtifactError):
    pass


@dataclass(frozen=True, slots=True)
class Artifact:
    digest: str  # hex SHA-256
    filename: str
    size: int

    @property
    def ref(self) -> str:
        return f"sha256:{self.digest}/{self.filename}"


def validate_filename(name: str) -> str:
    if not isinstance(name, str) or not FILENAME_RE.fullmatch(name) or ".." in name:
        raise ArtifactError(
            f"artifact file name {name!r} is invalid: a bare name of letters, digits, '.', '_' or '-' "
            "(no folders, no '..'), at most 128 characters"
        )
    if not name.lower().endswith(SUFFIXES):
        raise ArtifactError(f"artifact {name!r} has an unknown type; expected one of {', '.join(SUFFIXES)}")
    return name


def parse_ref(ref: str) -> tuple[str, str]:
    m = REF_RE.fullmatch(ref or "")
    if not m:
        raise ArtifactError(f"artifact reference {ref!r} is invalid: expected 'sha256:<64 hex>/<file name>'")
    return m["hex"], validate_filename(m["name"])


class ArtifactStore:
    def __init__(self, root: Path | str, max_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES):
        self.root = Path(root).resolve()
        self.max_bytes = max_bytes
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)

    def path(self, ref: str) -> Path:
        digest, name = parse_ref(ref)
        return self.root / "sha256" / digest[:2] / digest / name

    def has(self, ref: str) -> bool:
        return self.path(ref).is_file()

    def writer(self, filename: str) -> "ArtifactWriter":
        """An incremental writer: write() chunks as they arrive, then commit()."""
        return ArtifactWriter(self, validate_filename(filename))

    def put(self, chunks: Iterable[bytes], filename: str) -> Artifact:
        """Store a stream of bytes; refuses it past max_bytes without keeping any of it."""
        writer = self.writer(filename)
        try:
            for chunk in chunks:
                writer.write(chunk)
            return writer.commit()
        finally:
            writer.abort()

    def put_bytes(self, data: bytes, filename: str) -> Artifact:
        return self.put([data], filename)

    def put_file(self, path: Path | str, filename: str | None = None) -> Artifact:
        path = Path(path)

        def chunks():
            with open(path, "rb") as f:
                while block := f.read(1 << 20):
                    yield block

        return self.put(chunks(), filename or path.name)


class ArtifactWriter:
    """Hashes and writes to a temporary file inside the store; commit() renames it into
    place under its digest, abort() (always safe to call) removes what is left."""

    def __init__(self, store: ArtifactStore, filename: str):
        self.store = store
        self.filename = filename
        self.size = 0
        self._hash = hashlib.sha256()
        fd, name = tempfile.mkstemp(dir=store.root / "tmp")
        self._tmp = Path(name)
        self._file = os.fdopen(fd, "wb")

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.store.max_bytes:
            raise ArtifactTooLarge(f"artifact {self.filename!r} exceeds the limit of {self.store.max_bytes} bytes")
        self._hash.update(chunk)
        self._file.write(chunk)

    def commit(self, check: Callable[[Path, str], object] | None = None) -> Artifact:
        """Keep the file under its digest. `check(path, filename)`, when given, first looks at the
        complete file (functions.sniff.sniff_artifact); what it raises refuses the artifact, and
        abort() then removes it: a refused artifact is never in the store."""
        self._file.close()
        if check is not None:
            check(self._tmp, self.filename)
        artifact = Artifact(self._hash.hexdigest(), self.filename, self.size)
        final = self.store.path(artifact.ref)
        if not final.exists():
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self._tmp, final)
            os.chmod(final, 0o444)
        return artifact

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._tmp.unlink(missing_ok=True)
