"""A cheap look at an artifact's bytes: is it what its file name says it is? The control API runs
it at upload and at deploy, so a bad artifact is a 400 saying what is wrong rather than a
replica that fails to load later; each check reads a bounded amount of the file whatever its
size, and pickles are never opened (what each kind must look like: docs/reliability.md,
"Hostile artifacts"). Errors are ArtifactError, a SpecError (400). It imports nothing from
serving, autoscaler or deploy (functions is the bottom layer).
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

import yaml

from functions.artifacts import ArtifactError

KIND_BY_SUFFIX = {
    ".onnx": "onnx",
    ".pt": "torchscript", ".pth": "torchscript", ".torchscript": "torchscript",
    ".pkl": "pickle", ".pickle": "pickle", ".joblib": "pickle",
    ".py": "python",
    ".ipynb": "notebook",
    ".yaml": "profile", ".yml": "profile",
}

# a spec's `loader` names what the replica will load, whatever the file's name says
KIND_BY_LOADER = {"onnx": "onnx", "torchscript": "torchscript", "sklearn": "pickle", "handler": "python",
                  "kserve": "python", "profile": "profile"}

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SniffLimits:
    # a TorchScript archive stores its tensors uncompressed, so what it declares is about its size;
    # a 200 KB zip declaring 200 MB (zeros deflate 1000:1) is a bomb: 200 MB > 100 x 200 KB and > 64 MiB
    zip_ratio: int = 100
    zip_ratio_floor_bytes: int = 64 * MIB  # under this, any ratio (a small archive of text compresses well)
    zip_members: int = 100_000
    # protobuf fields walked: all of ModelProto's top level (a handful in a real model), then the graph's first ones
    onnx_fields: int = 10_000
    onnx_max_ir_version: int = 64  # onnx 1.23 writes IR version 14; a varint of garbage is usually far larger
    python_bytes: int = 16 * MIB
    notebook_bytes: int = 64 * MIB
    profile_bytes: int = 1 * MIB


def kind_of(filename: str) -> str:
    suffix = Path(filename).suffix.lower()
    try:
        return KIND_BY_SUFFIX[suffix]
    except KeyError:
        raise ArtifactError(f"artifact {filename!r} has an unknown type {suffix!r}; "
                            f"expected one of {', '.join(KIND_BY_SUFFIX)}") from None


def sniff_artifact(path: Path | str, filename: str | None = None, limits: SniffLimits = SniffLimits(),
                   loader: str | None = None) -> str:
    """The artifact's kind, after checking that its bytes are that kind; raises ArtifactError.
    `filename` is the name it is stored under (the file at `path` may be a temporary one);
    `loader`, a spec's, decides the kind when given."""
    name = filename or Path(path).name
    return check_kind(path, KIND_BY_LOADER.get(loader or "") or kind_of(name), name, limits)


def check_kind(path: Path | str, kind: str, name: str | None = None, limits: SniffLimits = SniffLimits()) -> str:
    if kind == "pickle":
        return kind  # never opened: unpickling runs code, and trust comes from the spec
    check = _CHECKS[kind]
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise ArtifactError(f"{name or Path(path).name} is empty; expected {_EXPECTED[kind]}")
        check(f, size, name or Path(path).name, limits)
    return kind


_EXPECTED = {
    "onnx": "a serialized onnx.ModelProto (onnx.save)",
    "torchscript": "the zip archive that torch.jit.save writes",
    "python": "a UTF-8 Python source file",
    "notebook": "a Jupyter notebook (nbformat JSON)",
    "profile": "an emulated-device profile: a YAML mapping with 'kind: profile'",
}


def _refuse(name: str, kind: str, detail: str) -> ArtifactError:
    return ArtifactError(f"{name} is not {_EXPECTED[kind]}: {detail}")


# ---------------------------------------------------------------------- ONNX (protobuf wire format)

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
# field number -> (name, wire type), from onnx.proto (ModelProto, GraphProto); tests compare them with onnx's own
MODEL_FIELDS = {1: ("ir_version", VARINT), 2: ("producer_name", LEN), 3: ("producer_version", LEN),
                4: ("domain", LEN), 5: ("model_version", VARINT), 6: ("doc_string", LEN), 7: ("graph", LEN),
                8: ("opset_import", LEN), 14: ("metadata_props", LEN), 20: ("training_info", LEN),
                25: ("functions", LEN), 26: ("configuration", LEN)}
GRAPH_FIELDS = {1: ("node", LEN), 2: ("name", LEN), 5: ("initializer", LEN), 10: ("doc_string", LEN),
                11: ("input", LEN), 12: ("output", LEN), 13: ("value_info", LEN),
                14: ("quantization_annotation", LEN), 15: ("sparse_initializer", LEN), 16: ("metadata_props", LEN)}


class _Malformed(Exception):
    pass


def _varint(f: BinaryIO, at: int, end: int) -> tuple[int, int]:
    f.seek(at)
    data = f.read(min(10, end - at))
    value = 0
    for i, byte in enumerate(data):
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return value, at + i + 1
    raise _Malformed(f"the varint at byte {at} does not end within 10 bytes or before byte {end}")


def _walk(f: BinaryIO, start: int, end: int, table: dict, budget: int) -> tuple[dict[int, list], bool]:
    """The fields of one message in [start, end): {field number: [a varint's value, or a LEN field's
    (payload start, payload end)]}, and whether all of it was walked (not when `budget` ran out first)."""
    seen: dict[int, list] = {}
    at = start
    for _ in range(budget):
        if at == end:
            return seen, True
        tag, pos = _varint(f, at, end)
        number, wire = tag >> 3, tag & 7
        if number == 0 or wire in (SGROUP, EGROUP) or wire > I32:
            raise _Malformed(f"byte {at}: tag {tag} (field {number}, wire type {wire}) is not a field of a message")
        field_name, expected = table.get(number, (f"field {number}", wire))
        if wire != expected:
            raise _Malformed(f"byte {at}: {field_name} (field {number}) has wire type {wire}, expected {expected}")
        value = pos
        if wire == VARINT:
            value, pos = _varint(f, pos, end)
        elif wire == LEN:
            length, pos = _varint(f, pos, end)
            value, pos = (pos, pos + length), pos + length
        else:
            pos += 8 if wire == I64 else 4
        if pos > end:
            raise _Malformed(f"{field_name} (field {number}) at byte {at} runs to byte {pos}, past the end at {end}")
        seen.setdefault(number, []).append(value)
        at = pos
    return seen, at == end


def _check_onnx(f: BinaryIO, size: int, name: str, limits: SniffLimits) -> None:
    try:
        top, whole = _walk(f, 0, size, MODEL_FIELDS, limits.onnx_fields)
        if not whole:
            raise _Malformed(f"more than {limits.onnx_fields} top-level fields (a model has a few)")
        if 1 not in top:
            raise _Malformed("no ir_version (field 1)")
        ir_version = top[1][-1]
        if not 1 <= ir_version <= limits.onnx_max_ir_version:
            raise _Malformed(f"ir_version {ir_version} is not an ONNX IR version (1-{limits.onnx_max_ir_version})")
        if 7 not in top:
            raise _Malformed("no graph (field 7)")
        graph_start, graph_end = top[7][-1]
        _walk(f, graph_start, graph_end, GRAPH_FIELDS, limits.onnx_fields)  # its first fields are enough
    except _Malformed as exc:
        raise _refuse(name, "onnx", str(exc)) from None


# ---------------------------------------------------------------------- TorchScript (zip central directory)

EOCD = struct.Struct("<4s4H2LH")  # end of central directory, 22 bytes
ZIP64_LOCATOR = struct.Struct("<4sLQL")  # 20 bytes, just before the EOCD
ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")  # 56 bytes
CENTRAL = struct.Struct("<4s6H3L5H2L")  # one central directory entry, 46 bytes, then name, extra, comment
MAX_COMMENT = 0xFFFF


def _check_torchscript(f: BinaryIO, size: int, name: str, limits: SniffLimits) -> None:
    try:
        entries, cd_size, cd_offset, cd_limit = _end_record(f, size)
    except _Malformed as exc:
        raise _refuse(name, "torchscript", str(exc)) from None
    if entries > limits.zip_members:
        raise _refuse(name, "torchscript", f"its central directory declares {entries} members, "
                                           f"more than the limit of {limits.zip_members}")
    if cd_offset + cd_size > cd_limit:
        raise _refuse(name, "torchscript", f"its central directory ({cd_size} bytes at byte {cd_offset}) "
                                           f"runs past its end record at byte {cd_limit}")
    total, has_constants = 0, False
    f.seek(cd_offset)
    for index in range(entries):
        member, unpacked = _central_entry(f, index, name)
        _check_member_name(member, name)
        total += unpacked
        _check_unpacked(total, size, index + 1, name, limits)
        has_constants = has_constants or member.rsplit("/", 1)[-1] == "constants.pkl"
        if f.tell() > cd_offset + cd_size:
            raise _refuse(name, "torchscript", f"central directory entry {index} runs past the directory's end")
    if not has_constants:
        raise _refuse(name, "torchscript", "a zip archive with no constants.pkl, so not a TorchScript module "
                                           "(torch.save writes a checkpoint; save the module with torch.jit.save)")


def _end_record(f: BinaryIO, size: int) -> tuple[int, int, int, int]:
    """(members, central directory size, its offset, where it must end), from the end of central
    directory record (zip64 when the classic fields are saturated)."""
    tail_len = min(size, EOCD.size + MAX_COMMENT)
    f.seek(size - tail_len)
    tail = f.read(tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + EOCD.size > len(tail):
        raise _Malformed("not a zip archive (no end of central directory record)")
    _, disk, cd_disk, on_disk, entries, cd_size, cd_offset, _ = EOCD.unpack_from(tail, at)
    eocd_at = size - tail_len + at
    if disk or cd_disk or on_disk != entries:
        raise _Malformed("a multi-part (split) zip archive")
    if 0xFFFF not in (entries,) and 0xFFFFFFFF not in (cd_size, cd_offset):
        return entries, cd_size, cd_offset, eocd_at
    locator_at = eocd_at - ZIP64_LOCATOR.size
    if locator_at < 0:
        raise _Malformed("a zip64 archive without its zip64 locator")
    f.seek(locator_at)
    signature, _, record_at, _ = ZIP64_LOCATOR.unpack(f.read(ZIP64_LOCATOR.size))
    if signature != b"PK\x06\x07" or record_at + ZIP64_EOCD.size > locator_at:
        raise _Malformed("a zip64 archive whose zip64 locator is damaged")
    f.seek(record_at)
    signature, *_, entries, cd_size, cd_offset = ZIP64_EOCD.unpack(f.read(ZIP64_EOCD.size))
    if signature != b"PK\x06\x06":
        raise _Malformed("a zip64 archive whose zip64 end record is damaged")
    return entries, cd_size, cd_offset, record_at


def _central_entry(f: BinaryIO, index: int, name: str) -> tuple[str, int]:
    """(member name, declared uncompressed size) of the next central directory entry."""
    head = f.read(CENTRAL.size)
    if len(head) < CENTRAL.size or head[:4] != b"PK\x01\x02":
        raise _refuse(name, "torchscript", f"central directory entry {index} is damaged")
    fields = CENTRAL.unpack(head)
    flags, unpacked = fields[3], fields[9]
    name_len, extra_len, comment_len = fields[10], fields[11], fields[12]
    raw = f.read(name_len)
    extra = f.read(extra_len)
    f.seek(comment_len, os.SEEK_CUR)
    if unpacked == 0xFFFFFFFF:
        unpacked = _zip64_size(extra, index, name)
    member = raw.decode("utf-8" if flags & 0x800 else "cp437", errors="replace")
    return member, unpacked


def _zip64_size(extra: bytes, index: int, name: str) -> int:
    """The uncompressed size from a zip64 extra field (header 0x0001; it comes first there)."""
    at = 0
    while at + 4 <= len(extra):
        header, length = struct.unpack_from("<2H", extra, at)
        if header == 1 and length >= 8 and at + 4 + length <= len(extra):
            return struct.unpack_from("<Q", extra, at + 4)[0]
        at += 4 + length
    raise _refuse(name, "torchscript", f"member {index} has a saturated size and no zip64 size")


def _check_member_name(member: str, name: str) -> None:
    parts = re.split(r"[\\/]", member)
    if (not member or "\x00" in member or member.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", member)
            or ".." in parts):
        raise _refuse(name, "torchscript", f"it has a member named {member!r}; names that are empty, absolute, "
                                           "carry a drive letter, NUL or a '..' part are refused")


def _check_unpacked(total: int, size: int, members: int, name: str, limits: SniffLimits) -> None:
    # no cap of its own on the total: a TorchScript archive stores tensors uncompressed, so a
    # large model declares about its size; only a total far beyond the file's is a bomb
    ratio_limit = max(limits.zip_ratio * size, limits.zip_ratio_floor_bytes)
    if total > ratio_limit:
        raise _refuse(name, "torchscript", (
            f"its first {members} member(s) declare {total} bytes uncompressed in a {size}-byte file "
            f"(a zip bomb?); the limit is {ratio_limit} bytes "
            f"({limits.zip_ratio}x the file's size, at least {limits.zip_ratio_floor_bytes})"))


# ---------------------------------------------------------------------- text artifacts (small by nature)

def _read_text(f: BinaryIO, size: int, limit: int, name: str, kind: str) -> str:
    if size > limit:
        raise _refuse(name, kind, f"{size} bytes is more than the limit of {limit} bytes for this kind of artifact")
    data = f.read(limit + 1)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _refuse(name, kind, f"byte 0x{data[exc.start]:02x} at offset {exc.start} is not UTF-8") from None
    if "\x00" in text:
        raise _refuse(name, kind, f"it contains a NUL byte (at offset {text.index(chr(0))}): binary, not text")
    return text


def _check_python(f: BinaryIO, size: int, name: str, limits: SniffLimits) -> None:
    if size > limits.python_bytes:
        raise _refuse(name, "python", f"{size} bytes is more than the limit of {limits.python_bytes} bytes "
                                      "for this kind of artifact")
    data = f.read(limits.python_bytes + 1)
    try:
        # the bytes, as the import system reads them: a UTF-8 BOM or a coding line is honoured
        ast.parse(data, filename=name)  # parses only: nothing in the file runs
    except (SyntaxError, ValueError) as exc:  # ValueError: a NUL byte (SyntaxError from Python 3.12)
        message = str(getattr(exc, "msg", exc))
        if isinstance(exc, ValueError) or any(m in message for m in ("decode", "encoding", "null bytes")):
            _read_text(io.BytesIO(data), size, limits.python_bytes, name, "python")  # says which byte
            raise _refuse(name, "python", f"it is not text in its declared encoding: {message}") from None
        raise _refuse(name, "python", f"a syntax error on line {exc.lineno}: {message}") from None
    except (RecursionError, MemoryError):
        raise _refuse(name, "python", "it is nested too deeply to parse") from None


def _check_notebook(f: BinaryIO, size: int, name: str, limits: SniffLimits) -> None:
    text = _read_text(f, size, limits.notebook_bytes, name, "notebook")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise _refuse(name, "notebook", f"not JSON ({exc})") from None
    except RecursionError:
        raise _refuse(name, "notebook", "JSON nested too deeply") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list) or not isinstance(doc.get("nbformat"), int):
        raise _refuse(name, "notebook", "JSON without 'cells' (a list) and 'nbformat' (an integer)")


def _check_profile(f: BinaryIO, size: int, name: str, limits: SniffLimits) -> None:
    text = _read_text(f, size, limits.profile_bytes, name, "profile")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _refuse(name, "profile", f"not valid YAML ({' '.join(str(exc).split())})") from None
    except RecursionError:
        raise _refuse(name, "profile", "YAML nested too deeply") from None
    if not isinstance(doc, dict) or doc.get("kind") != "profile":
        found = f"kind {doc.get('kind')!r}" if isinstance(doc, dict) else f"a {type(doc).__name__}"
        raise _refuse(name, "profile", f"found {found}")


_CHECKS: dict[str, Callable[[BinaryIO, int, str, SniffLimits], None]] = {
    "onnx": _check_onnx,
    "torchscript": _check_torchscript,
    "python": _check_python,
    "notebook": _check_notebook,
    "profile": _check_profile,
}

__all__ = ["KIND_BY_SUFFIX", "SniffLimits", "check_kind", "kind_of", "sniff_artifact"]
