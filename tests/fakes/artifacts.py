"""Artifact bytes for tests, good and hostile, written by hand so that every field is the test's choice:
a minimal ONNX ModelProto in protobuf's wire format, and zip archives laid out like torch.jit.save's
(with any member names, declared sizes, zip64 records or a real deflate bomb)."""

from __future__ import annotations

import io
import json
import struct
import zipfile
import zlib

# ---------------------------------------------------------------------- protobuf

VARINT, LEN = 0, 2


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def pb_int(field: int, value: int) -> bytes:
    return varint(field << 3 | VARINT) + varint(value)


def pb_len(field: int, payload: bytes) -> bytes:
    return varint(field << 3 | LEN) + varint(len(payload)) + payload


def _value_info(name: bytes) -> bytes:
    """ValueInfoProto{name: 1, type: 2{tensor_type: 1{elem_type: 1 (FLOAT), shape: 2{dim: 1{dim_param: 2 "n"}}}}}"""
    return pb_len(1, name) + pb_len(2, pb_len(1, pb_int(1, 1) + pb_len(2, pb_len(1, pb_len(2, b"n")))))


NODE = pb_len(1, b"x") + pb_len(2, b"y") + pb_len(4, b"Identity")  # NodeProto: input 1, output 2, op_type 4
GRAPH = pb_len(1, NODE) + pb_len(2, b"g") + pb_len(11, _value_info(b"x")) + pb_len(12, _value_info(b"y"))


def onnx_model(ir_version: int = 8, graph: bytes = GRAPH, opset: int = 13) -> bytes:
    """ModelProto{ir_version: 1, producer_name: 2, graph: 7, opset_import: 8{version: 2}}: y = Identity(x)."""
    return pb_int(1, ir_version) + pb_len(2, b"shoal-test") + pb_len(7, graph) + pb_len(8, pb_int(2, opset))


# ---------------------------------------------------------------------- zip archives

LOCAL = struct.Struct("<4s5H3L2H")
CENTRAL = struct.Struct("<4s6H3L5H2L")
EOCD = struct.Struct("<4s4H2LH")

TORCHSCRIPT_MEMBERS = [(b"archive/data.pkl", b"\x80\x02}q\x00."), (b"archive/constants.pkl", b"\x80\x02)."),
                       (b"archive/code/__torch__.py", b"class M(Module):\n  pass\n"), (b"archive/version", b"3\n")]


def stored_zip(members: list[tuple[bytes, bytes]], declared: dict[bytes, int] | None = None) -> bytes:
    """An uncompressed zip, as torch.jit.save writes one; `declared` overrides a member's uncompressed size in
    the central directory (>= 4 GiB goes in a zip64 extra field)."""
    out, central = bytearray(), bytearray()
    for name, data in members:
        offset, crc = len(out), zlib.crc32(data)
        out += LOCAL.pack(b"PK\x03\x04", 20, 0, 0, 0, 0, crc, len(data), len(data), len(name), 0) + name + data
        size = (declared or {}).get(name, len(data))
        extra = b""
        if size >= 0xFFFFFFFF:
            extra, size = struct.pack("<2HQ", 1, 8, size), 0xFFFFFFFF
        central += CENTRAL.pack(b"PK\x01\x02", 45, 20, 0, 0, 0, 0, crc, len(data), size, len(name), len(extra),
                                0, 0, 0, 0, offset) + name + extra
    cd_offset = len(out)
    out += central
    out += EOCD.pack(b"PK\x05\x06", 0, 0, len(members), len(members), len(central), cd_offset, 0)
    return bytes(out)


def as_zip64(data: bytes, entries: int | None = None) -> bytes:
    """The same archive with its end record moved to zip64 records (the classic one saturated),
    optionally declaring `entries` members."""
    _, _, _, _, count, cd_size, cd_offset, _ = EOCD.unpack(data[-EOCD.size:])
    body = data[:-EOCD.size]
    count = count if entries is None else entries
    record = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, cd_size, cd_offset)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, len(body), 1)
    return body + record + locator + EOCD.pack(b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)


def patch_eocd(data: bytes, **fields: int) -> bytes:
    """The archive with fields of its classic end record replaced (disk, entries, cd_size, cd_offset)."""
    names = ("signature", "disk", "cd_disk", "on_disk", "entries", "cd_size", "cd_offset", "comment_len")
    values = dict(zip(names, EOCD.unpack(data[-EOCD.size:])))
    if "entries" in fields:
        fields["on_disk"] = fields["entries"]
    values.update(fields)
    return data[:-EOCD.size] + EOCD.pack(*values.values())


def deflate_bomb(unpacked_mib: int) -> bytes:
    """A real zip bomb: `unpacked_mib` MiB of zeros deflated (about 1000:1), with a constants.pkl so that only
    its size gives it away. Written in 1 MiB chunks: the test never holds the unpacked bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("archive/constants.pkl", b"\x80\x02).")
        with zf.open("archive/data/0", "w", force_zip64=True) as member:
            chunk = bytes(1024 * 1024)
            for _ in range(unpacked_mib):
                member.write(chunk)
    return buffer.getvalue()


def notebook(cells: list[str] | None = None) -> bytes:
    return json.dumps({"cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": [],
                                  "execution_count": None} for c in cells or []],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()
