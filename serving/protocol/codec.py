"""Tensor codec (pure, no I/O): V2 JSON tensors, the binary tensor extension and V1 bodies. Every
malformed body raises InvalidInput naming the value and what was expected. In the binary
extension (Triton's, also KServe's) the body is a JSON header of
`Inference-Header-Content-Length` bytes, then the raw tensors in input order, each sized by its
`parameters.binary_data_size`: fixed-size types little-endian and row-major, BOOL one byte,
each BYTES element a 4-byte little-endian length and its bytes.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import orjson

from serving.protocol.datatypes import FLOAT_TYPES, INTEGER_TYPES, numpy_dtype
from serving.protocol.errors import InvalidInput
from serving.protocol.types import InferRequest, InferResponse, RequestedOutput, Tensor

_LEN = struct.Struct("<I")

# numpy kinds a JSON array may decode to, per target datatype family.
_OK_KINDS_FLOAT = frozenset("biuf")
_OK_KINDS_INT = frozenset("biu")


def parse_json(body: bytes | bytearray | memoryview, what: str = "request body") -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"{what} is not valid JSON: {exc}") from None


def parse_header_length(value: str | None, body_len: int) -> int | None:
    """The JSON header length of a binary-extension body, or None for plain JSON."""
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise InvalidInput(
            f"Inference-Header-Content-Length {value!r} is not an integer"
        ) from None
    if not 0 < length <= body_len:
        raise InvalidInput(
            f"Inference-Header-Content-Length ({length}) must be within 1..{body_len}, the body length"
        )
    return length


# ---------------------------------------------------------------------------- requests


def decode_infer_request(body: bytes, header_length: int | None = None) -> InferRequest:
    """Decode a V2 inference request body (JSON, or JSON header + binary tensors)."""
    view = memoryview(body)
    if header_length is None:
        header, binary = parse_json(body), view[len(body):]
    else:
        header, binary = parse_json(view[:header_length], "JSON header"), view[header_length:]
    if not isinstance(header, dict):
        raise InvalidInput(f"request must be a JSON object, got {type(header).__name__}")
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list):
        raise InvalidInput("request needs 'inputs', a list of tensors")
    inputs: list[Tensor] = []
    offset = 0
    for i, raw in enumerate(raw_inputs):
        tensor, used = _decode_input(raw, i, binary, offset)
        inputs.append(tensor)
        offset += used
    if offset != len(binary):
        raise InvalidInput(
            f"binary data has {len(binary)} bytes but the inputs' binary_data_size add up to {offset}"
        )
    parameters = _parameters(header.get("parameters"), "request")
    return InferRequest(
        inputs=inputs,
        id=_request_id(header.get("id")),
        outputs=_requested_outputs(header.get("outputs")),
        parameters=parameters,
        binary_output=bool(parameters.get("binary_data_output", False)),
    )


def _request_id(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InvalidInput(f"'id' must be a string, got {value!r}")


def _parameters(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"'parameters' of the {where} must be an object, got {type(value).__name__}")
    return value


def _requested_outputs(value: Any) -> list[RequestedOutput] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidInput("'outputs' must be a list of {\"name\": ...} objects")
    outs = []
    for raw in value:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise InvalidInput(f"each requested output needs a string 'name', got {raw!r}")
        if any(o.name == raw["name"] for o in outs):
            raise InvalidInput(f"output {raw['name']!r} is requested twice")
        params = _parameters(raw.get("parameters"), f"output {raw['name']!r}")
        binary = params.get("binary_data")
        outs.append(RequestedOutput(raw["name"], None if binary is None else bool(binary)))
    return outs


def _decode_input(raw: Any, index: int, binary: memoryview, offset: int) -> tuple[Tensor, int]:
    if not isinstance(raw, dict):
        raise InvalidInput(f"input #{index} must be an object, got {type(raw).__name__}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"input #{index} needs a non-empty string 'name'")
    datatype = raw.get("datatype")
    try:
        dtype = numpy_dtype(datatype)
    except ValueError as exc:
        raise InvalidInput(f"input {name!r}: {exc}") from None
    shape = _shape(raw.get("shape"), name)
    params = _parameters(raw.get("parameters"), f"input {name!r}")
    size = params.get("binary_data_size")
    if size is not None:
        if "data" in raw:
            raise InvalidInput(f"input {name!r} has both 'data' and parameters.binary_data_size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInput(f"input {name!r}: binary_data_size {size!r} must be a non-negative integer")
        if offset + size > len(binary):
            raise InvalidInput(
                f"input {name!r}: binary_data_size {size} but only {len(binary) - offset} bytes "
                "of binary data remain (truncated body?)"
            )
        data = decode_binary(binary[offset:offset + size], datatype, dtype, shape, name)
        return Tensor(name, datatype, shape, data, params or None), size
    if "data" not in raw:
        raise InvalidInput(f"input {name!r} has no 'data' and no parameters.binary_data_size")
    data = decode_json_data(raw["data"], datatype, dtype, shape, name)
    return Tensor(name, datatype, shape, data, params or None), 0


MAX_DIM = 2**31 - 1
MAX_RANK = 32
# numpy cannot even describe an array whose non-zero dimensions multiply past its index range, empty or not
MAX_EXTENT = 2**62


def _shape(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value
    ):
        raise InvalidInput(f"input {name!r}: shape {value!r} must be a list of non-negative integers")
    if len(value) > MAX_RANK or any(d > MAX_DIM for d in value):
        raise InvalidInput(
            f"input {name!r}: shape {value!r} is out of range (at most {MAX_RANK} dimensions of at most {MAX_DIM})"
        )
    if math.prod(max(d, 1) for d in value) > MAX_EXTENT:  # e.g. [0, 794, 226105, 226477, 226848]
        raise InvalidInput(f"input {name!r}: shape {value!r} spans more than 2**62 elements, even with a 0 in it")
    return tuple(value)


def decode_json_data(data: Any, datatype: str, dtype: np.dtype, shape: tuple[int, ...], name: str) -> np.ndarray:
    """JSON tensor data (flat or nested, row-major) to an array of `shape`."""
    if not isinstance(data, list):
        raise InvalidInput(f"input {name!r}: 'data' must be a list, got {type(data).__name__}")
    count = math.prod(shape)
    if datatype == "BYTES":
        arr = _decode_json_bytes(data, name, shape)
    else:
        try:
            raw = np.asarray(data)
        except ValueError:
            raise InvalidInput(f"input {name!r}: 'data' is a ragged nested list; expected shape {list(shape)}") from None
        arr = cast_json_array(raw, datatype, dtype, name)
        if raw.ndim > 1 and raw.shape != shape:
            raise InvalidInput(
                f"input {name!r}: nested data has shape {list(raw.shape)} but 'shape' is {list(shape)}"
            )
    if arr.size != count:
        raise InvalidInput(
            f"input {name!r}: shape {list(shape)} needs {count} values but 'data' has {arr.size}"
        )
    return arr.reshape(shape)


def cast_json_array(raw: np.ndarray, datatype: str, dtype: np.dtype, name: str) -> np.ndarray:
    kind = raw.dtype.kind
    if raw.size == 0:
        return raw.astype(dtype)
    if datatype == "BOOL":
        if kind != "b":
            raise InvalidInput(f"input {name!r}: BOOL data must be true/false, got {_sample(raw)}")
    elif datatype in INTEGER_TYPES:
        if kind not in _OK_KINDS_INT:
            raise InvalidInput(f"input {name!r}: {datatype} data must be integers, got {_sample(raw)}")
        info = np.iinfo(dtype)
        lo, hi = raw.min(), raw.max()
        if lo < info.min or hi > info.max:
            raise InvalidInput(
                f"input {name!r}: values {lo}..{hi} do not fit {datatype} ({info.min}..{info.max})"
            )
    elif datatype in FLOAT_TYPES and kind not in _OK_KINDS_FLOAT:
        raise InvalidInput(f"input {name!r}: {datatype} data must be numbers, got {_sample(raw)}")
    return raw.astype(dtype, copy=False)


_KIND_NAMES = {"U": "strings", "S": "strings", "O": "mixed or out-of-range values",
               "f": "fractional numbers", "b": "booleans", "i": "integers", "u": "integers"}


def _sample(raw: np.ndarray) -> str:
    """Name what the data holds, with the first value that shows it."""
    flat = raw.reshape(-1)
    example = flat[0]
    if raw.dtype.kind in "US":
        example = next((v for v in flat[:256] if not _is_number(str(v))), example)
    elif raw.dtype.kind == "f":
        example = next((v for v in flat[:256] if not float(v).is_integer()), example)
    value = example.item() if hasattr(example, "item") else example
    return f"{_KIND_NAMES.get(raw.dtype.kind, str(raw.dtype))} such as {value!r}"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _decode_json_bytes(data: list, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Strings, flat or nested no deeper than the shape, to an object array of bytes."""
    flat: list[bytes] = []
    stack = [(iter(data), 1)]
    depth_limit = max(1, len(shape))
    while stack:
        items, depth = stack[-1]
        item = next(items, _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, list):
            if depth >= depth_limit:
                raise InvalidInput(f"input {name!r}: BYTES data is nested deeper than its shape {list(shape)}")
            stack.append((iter(item), depth + 1))
        elif isinstance(item, str):
            flat.append(item.encode("utf-8"))
        else:
            raise InvalidInput(f"input {name!r}: BYTES data must be strings, got {item!r}")
    arr = np.empty(len(flat), dtype=np.object_)
    arr[:] = flat
    return arr


_END = object()


def decode_binary(chunk: memoryview, datatype: str, dtype: np.dtype, shape: tuple[int, ...], name: str) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        return decode_bytes_elements(chunk, count, name).reshape(shape)
    expected = count * dtype.itemsize
    if len(chunk) != expected:
        raise InvalidInput(
            f"input {name!r}: binary_data_size is {len(chunk)} bytes but shape {list(shape)} "
            f"of {datatype} needs {expected}"
        )
    return np.frombuffer(chunk, dtype=dtype.newbyteorder("<")).reshape(shape)


def decode_bytes_elements(chunk: memoryview, count: int, name: str) -> np.ndarray:
    if count * 4 > len(chunk):  # every element has a 4-byte length: check before allocating
        raise InvalidInput(
            f"input {name!r}: {count} BYTES elements need at least {count * 4} bytes, "
            f"binary_data_size is {len(chunk)}"
        )
    out = np.empty(count, dtype=np.object_)
    pos = 0
    for i in range(count):
        if pos + 4 > len(chunk):
            raise InvalidInput(f"input {name!r}: BYTES element {i} of {count} is truncated (no length prefix)")
        (length,) = _LEN.unpack_from(chunk, pos)
        pos += 4
        if pos + length > len(chunk):
            raise InvalidInput(
                f"input {name!r}: BYTES element {i} claims {length} bytes but {len(chunk) - pos} remain"
            )
        out[i] = bytes(chunk[pos:pos + length])
        pos += length
    if pos != len(chunk):
        raise InvalidInput(f"input {name!r}: {len(chunk) - pos} bytes left after {count} BYTES elements")
    return out


def encode_bytes_elements(arr: np.ndarray) -> bytes:
    parts = []
    for item in arr.reshape(-1):
        b = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(_LEN.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


# ---------------------------------------------------------------------------- responses


def _json_data(arr: np.ndarray, datatype: str) -> Any:
    if datatype == "BYTES":
        return [
            item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
            for item in arr.reshape(-1)
        ]
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.dtype == np.float16:
        flat = flat.astype(np.float32)
    return flat


def binary_bytes(arr: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return encode_bytes_elements(arr)
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def encode_infer_response(resp: InferResponse, binary_names: frozenset[str] = frozenset()) -> tuple[bytes, int | None]:
    """The body, and its JSON header length (None for plain JSON); outputs named in `binary_names`
    go in the binary extension."""
    outputs = []
    chunks: list[bytes] = []
    for out in resp.outputs:
        entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": list(out.shape)}
        if out.name in binary_names:
            raw = binary_bytes(out.data, out.datatype)
            entry["parameters"] = {**(out.parameters or {}), "binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            if out.parameters:
                entry["parameters"] = out.parameters
            entry["data"] = _json_data(out.data, out.datatype)
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": resp.model_name}
    if resp.model_version is not None:
        doc["model_version"] = resp.model_version
    if resp.id is not None:
        doc["id"] = resp.id
    if resp.parameters:
        doc["parameters"] = resp.parameters
    doc["outputs"] = outputs
    header = dumps(doc)
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)


def binary_output_names(request: InferRequest, produced: list[str]) -> frozenset[str]:
    """Which outputs go in the binary extension: an output's own `binary_data` when it
    says, else the request's `binary_data_output` (Triton's and KServe's rule)."""
    if request.outputs is None:
        return frozenset(produced) if request.binary_output else frozenset()
    return frozenset(
        o.name for o in request.outputs if (o.binary if o.binary is not None else request.binary_output)
    )


def dumps(doc: Any) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY, default=_default)


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")
