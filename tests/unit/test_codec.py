"""The tensor codec, table-driven: JSON and binary tensors of every V2 datatype numpy has,
and every malformed body answered with InvalidInput naming the value."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest

from serving.protocol.codec import (
    binary_output_names,
    decode_infer_request,
    encode_infer_response,
    parse_header_length,
)
from serving.protocol.datatypes import V2_TO_NUMPY
from serving.protocol.errors import InvalidInput
from serving.protocol.types import InferResponse, Tensor

NUMERIC = [d for d in V2_TO_NUMPY if d not in ("BYTES", "BOOL")]


def _req(*inputs, **extra) -> bytes:
    return orjson.dumps({"inputs": list(inputs), **extra})


def _binary_body(header: dict, *chunks: bytes) -> tuple[bytes, int]:
    js = orjson.dumps(header)
    return js + b"".join(chunks), len(js)


@pytest.mark.parametrize("datatype", NUMERIC)
def test_json_numeric_round_trip(datatype):
    dtype = V2_TO_NUMPY[datatype]
    values = [0, 1, 2, 3, 4, 5]
    req = decode_infer_request(_req({"name": "x", "shape": [2, 3], "datatype": datatype, "data": values}))
    t = req.inputs[0]
    assert t.data.dtype == dtype and t.shape == (2, 3)
    np.testing.assert_array_equal(t.data, np.arange(6, dtype=dtype).reshape(2, 3))


@pytest.mark.parametrize("datatype", NUMERIC + ["BOOL"])
def test_binary_round_trip(datatype):
    dtype = V2_TO_NUMPY[datatype]
    arr = (np.arange(6) % 2 == 1) if datatype == "BOOL" else np.arange(6).astype(dtype)
    raw = arr.astype(dtype).astype(dtype.newbyteorder("<")).tobytes()
    header = {"inputs": [{"name": "x", "shape": [3, 2], "datatype": datatype, "parameters": {"binary_data_size": len(raw)}}]}
    body, n = _binary_body(header, raw)
    t = decode_infer_request(body, n).inputs[0]
    np.testing.assert_array_equal(t.data, arr.astype(dtype).reshape(3, 2))


def test_nested_json_data_is_row_major():
    req = decode_infer_request(_req({"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]}))
    np.testing.assert_array_equal(req.inputs[0].data, [[1, 2], [3, 4]])


def test_bytes_json_and_binary():
    req = decode_infer_request(_req({"name": "s", "shape": [2], "datatype": "BYTES", "data": ["héllo", ""]}))
    assert req.inputs[0].data.tolist() == ["héllo".encode(), b""]
    elements = [b"ab", b"", b"\xff\x00"]
    raw = b"".join(struct.pack("<I", len(e)) + e for e in elements)
    header = {"inputs": [{"name": "s", "shape": [3], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}]}
    body, n = _binary_body(header, raw)
    assert decode_infer_request(body, n).inputs[0].data.tolist() == elements


def test_request_fields():
    req = decode_infer_request(
        _req(
            {"name": "x", "shape": [1], "datatype": "INT32", "data": [7]},
            id="abc",
            outputs=[{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"},
                     {"name": "w", "parameters": {"binary_data": False}}],
            parameters={"binary_data_output": True},
        )
    )
    assert req.id == "abc" and req.binary_output
    assert [(o.name, o.binary) for o in req.outputs] == [("y", True), ("z", None), ("w", False)]
    # z says nothing, so the request's binary_data_output decides; w overrides it
    assert binary_output_names(req, ["y", "z", "w"]) == frozenset({"y", "z"})


BAD = [
    # id, body, header_length, fragment of the message
    ("not-json", b"{nope", None, "not valid JSON"),
    ("not-an-object", b"[1,2]", None, "must be a JSON object"),
    ("no-inputs", b"{}", None, "needs 'inputs'"),
    ("input-without-name", _req({"shape": [1], "datatype": "FP32", "data": [1]}), None, "non-empty string 'name'"),
    ("unknown-datatype", _req({"name": "x", "shape": [1], "datatype": "FP8", "data": [1]}), None, "unknown datatype 'FP8'"),
    ("bf16-refused", _req({"name": "x", "shape": [1], "datatype": "BF16", "data": [1]}), None, "'BF16' is not supported"),
    ("negative-dim", _req({"name": "x", "shape": [-1, 2], "datatype": "FP32", "data": [1, 2]}), None, "non-negative integers"),
    # shape [2, 3] needs 2*3 = 6 values, 4 given
    ("count-mismatch", _req({"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4]}), None, "needs 6 values but 'data' has 4"),
    ("nested-shape-mismatch", _req({"name": "x", "shape": [3, 2], "datatype": "FP32", "data": [[1, 2, 3], [4, 5, 6]]}), None, "nested data has shape [2, 3]"),
    ("ragged", _req({"name": "x", "shape": [3], "datatype": "FP32", "data": [[1], [2, 3]]}), None, "ragged"),
    ("string-in-fp32", _req({"name": "x", "shape": [2], "datatype": "FP32", "data": [1, "a"]}), None, "FP32 data must be numbers, got strings such as 'a'"),
    ("float-in-int32", _req({"name": "x", "shape": [2], "datatype": "INT32", "data": [1, 2.5]}), None, "INT32 data must be integers, got fractional numbers such as 2.5"),
    ("overflow-uint8", _req({"name": "x", "shape": [2], "datatype": "UINT8", "data": [1, 256]}), None, "values 1..256 do not fit UINT8 (0..255)"),
    ("int-for-bool", _req({"name": "x", "shape": [1], "datatype": "BOOL", "data": [1]}), None, "BOOL data must be true/false"),
    ("number-for-bytes", _req({"name": "x", "shape": [1], "datatype": "BYTES", "data": [1]}), None, "BYTES data must be strings"),
    ("no-data", _req({"name": "x", "shape": [1], "datatype": "FP32"}), None, "has no 'data'"),
    ("bad-id", _req({"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}, id=5), None, "'id' must be a string"),
    ("bad-outputs", _req({"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}, outputs=["y"]), None, "string 'name'"),
    ("output-twice", _req({"name": "x", "shape": [1], "datatype": "FP32", "data": [1]},
                          outputs=[{"name": "y"}, {"name": "y"}]), None, "output 'y' is requested twice"),
    # 2**63 rows of nothing: the product is 0, so only the bound on a dimension catches it
    ("huge-dim", _req({"name": "x", "shape": [2**63, 0], "datatype": "FP32", "data": []}), None, "out of range"),
    ("bytes-nested-deeper-than-shape",
     _req({"name": "s", "shape": [1], "datatype": "BYTES", "data": [[["a"]]]}), None, "nested deeper than its shape [1]"),
    # 1,000 levels of nesting would overflow a recursive walk; the iterative one stops at the shape's depth
    ("bytes-very-deep",
     b'{"inputs": [{"name": "s", "shape": [1], "datatype": "BYTES", "data": [' + b"[" * 900 + b'"a"' + b"]" * 900 + b"]}]}",
     None, "nested deeper"),
]


@pytest.mark.parametrize("body,header_length,fragment", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_json_requests(body, header_length, fragment):
    with pytest.raises(InvalidInput) as err:
        decode_infer_request(body, header_length)
    assert fragment in err.value.message


def _fp32_header(size: int, shape=(4,)) -> dict:
    return {"inputs": [{"name": "x", "shape": list(shape), "datatype": "FP32", "parameters": {"binary_data_size": size}}]}


BAD_BINARY = [
    # 4 FP32 values need 4*4 = 16 bytes; only 10 follow the header
    ("truncated-body", _fp32_header(16), b"\0" * 10, "only 10 bytes of binary data remain"),
    # binary_data_size 12 but 4 FP32 values need 16
    ("size-does-not-match-shape", _fp32_header(12), b"\0" * 12, "needs 16"),
    # 16 bytes used, 20 sent
    ("extra-trailing-bytes", _fp32_header(16), b"\0" * 20, "binary data has 20 bytes but"),
    ("bytes-element-truncated",
     {"inputs": [{"name": "s", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 6}}]},
     struct.pack("<I", 9) + b"ab", "claims 9 bytes but 2 remain"),
    ("negative-size", _fp32_header(-1), b"", "must be a non-negative integer"),
    # 2**27 BYTES elements need at least 4 * 2**27 bytes: refused before anything is allocated
    ("bytes-count-beyond-body",
     {"inputs": [{"name": "s", "shape": [2**27], "datatype": "BYTES", "parameters": {"binary_data_size": 0}}]},
     b"", "134217728 BYTES elements need at least 536870912 bytes"),
]


@pytest.mark.parametrize("header,tail,fragment", [c[1:] for c in BAD_BINARY], ids=[c[0] for c in BAD_BINARY])
def test_bad_binary_requests(header, tail, fragment):
    body, n = _binary_body(header, tail)
    with pytest.raises(InvalidInput) as err:
        decode_infer_request(body, n)
    assert fragment in err.value.message


@pytest.mark.parametrize(
    "value,body_len,fragment",
    [("abc", 10, "not an integer"), ("0", 10, "within 1..10"), ("11", 10, "within 1..10")],
    ids=["not-int", "zero", "beyond-body"],
)
def test_bad_header_length(value, body_len, fragment):
    with pytest.raises(InvalidInput) as err:
        parse_header_length(value, body_len)
    assert fragment in err.value.message


def test_encode_response_json_and_binary():
    probs = np.array([[0.25, 0.75]], dtype=np.float32)
    label = np.array([1], dtype=np.int64)
    words = np.array([b"a", b"bc"], dtype=np.object_)
    resp = InferResponse(
        model_name="m", model_version="1", id="q",
        outputs=[Tensor("p", "FP32", (1, 2), probs), Tensor("l", "INT64", (1,), label), Tensor("w", "BYTES", (2,), words)],
    )
    body, n = encode_infer_response(resp)
    assert n is None
    doc = orjson.loads(body)
    assert doc["id"] == "q" and doc["model_version"] == "1"
    assert doc["outputs"][0] == {"name": "p", "datatype": "FP32", "shape": [1, 2], "data": [0.25, 0.75]}
    assert doc["outputs"][2]["data"] == ["a", "bc"]

    body, n = encode_infer_response(resp, frozenset({"p", "w"}))
    header = orjson.loads(body[:n])
    sizes = [o.get("parameters", {}).get("binary_data_size") for o in header["outputs"]]
    assert sizes == [8, None, 4 + 1 + 4 + 2]  # 2 FP32 = 8 bytes; BYTES: (4+1) + (4+2)
    assert "data" not in header["outputs"][0] and header["outputs"][1]["data"] == [1]
    tail = body[n:]
    np.testing.assert_array_equal(np.frombuffer(tail[:8], "<f4").reshape(1, 2), probs)
    assert tail[8:] == struct.pack("<I", 1) + b"a" + struct.pack("<I", 2) + b"bc"


def test_float32_json_round_trips_exactly():
    """orjson writes the shortest repr that round-trips float32, so a client parsing
    the JSON back to float32 gets the very same bits."""
    values = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    resp = InferResponse("m", "1", [Tensor("v", "FP32", (1000,), values)])
    data = orjson.loads(encode_infer_response(resp)[0])["outputs"][0]["data"]
    np.testing.assert_array_equal(np.asarray(data, dtype=np.float32), values)
