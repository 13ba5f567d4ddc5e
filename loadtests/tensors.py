"""V2 inference request bodies for a model, built from its metadata (`GET /v2/models/{name}`):
tensors of the declared shapes and datatypes (`-1` dimensions become `batch`, values random but
fixed by the seed), encoded once as JSON or with the binary tensor extension (a JSON header,
then the raw little-endian bytes; its length in the `Inference-Header-Content-Length` header).
Client side only: the server's codec lives in serving/ and is not imported here.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

DTYPES: dict[str, str] = {
    "BOOL": "?", "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
    "INT8": "<i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
    "FP16": "<f2", "FP32": "<f4", "FP64": "<f8",
}
ENCODINGS = ("json", "binary")


@dataclass(frozen=True)
class Body:
    """An encoded request: bytes and the headers that go with them."""

    data: bytes
    headers: dict[str, str]
    rows: int


def body_for(metadata: dict[str, Any], *, encoding: str = "json", batch: int = 1, seed: int = 0) -> Body:
    """One request body for the model `metadata` describes; ValueError for what cannot be built."""
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown encoding {encoding!r}; allowed: {', '.join(ENCODINGS)}")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch={batch!r}: must be an integer >= 1")
    inputs = metadata.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ValueError(f"model {metadata.get('name')!r} declares no inputs in its metadata")
    rng = np.random.default_rng(seed)
    tensors = [(spec["name"], spec["datatype"], _tensor(spec, batch, rng)) for spec in inputs]
    if encoding == "json":
        doc = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": d, "data": _json_data(a, d)}
                          for n, d, a in tensors]}
        return Body(json.dumps(doc).encode(), {"content-type": "application/json"}, batch)
    raw = [_raw(a, d) for _, d, a in tensors]
    header = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": d, "parameters": {"binary_data_size": len(b)}}
                         for (n, d, a), b in zip(tensors, raw)],
              "parameters": {"binary_data_output": True}}
    head = json.dumps(header).encode()
    return Body(head + b"".join(raw), {"content-type": "application/octet-stream",
                                       "inference-header-content-length": str(len(head))}, batch)


def _tensor(spec: dict[str, Any], batch: int, rng: np.random.Generator) -> np.ndarray:
    name, datatype, shape = spec.get("name"), spec.get("datatype"), spec.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= -1 for d in shape):
        raise ValueError(f"input {name!r}: shape {shape!r} is not a list of dimensions")
    dims = tuple(batch if d == -1 else d for d in shape)
    if datatype == "BYTES":
        return np.array([f"text {i}" for i in range(int(np.prod(dims)))], dtype=object).reshape(dims)
    if datatype not in DTYPES:
        raise ValueError(f"input {name!r}: datatype {datatype!r} is not one a load test can generate")
    if datatype == "BOOL":
        return rng.random(dims) < 0.5
    dtype = np.dtype(DTYPES[datatype])
    if dtype.kind == "f":
        return rng.random(dims).astype(dtype)
    return rng.integers(0, 16, dims).astype(dtype)


def _json_data(a: np.ndarray, datatype: str) -> list:
    return a.reshape(-1).tolist() if datatype != "BYTES" else [str(s) for s in a.reshape(-1)]


def _raw(a: np.ndarray, datatype: str) -> bytes:
    if datatype != "BYTES":
        return np.ascontiguousarray(a, dtype=DTYPES[datatype]).tobytes()
    return b"".join(struct.pack("<I", len(e)) + e for e in (str(s).encode() for s in a.reshape(-1)))
