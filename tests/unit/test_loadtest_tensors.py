"""loadtests/tensors.py: request bodies from model metadata, checked by the server's own decoder."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from loadtests.tensors import body_for
from serving.protocol.codec import decode_infer_request

DIGITS = {"name": "digits", "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, 64]}]}


def decode(body):
    length = body.headers.get("inference-header-content-length")
    return decode_infer_request(body.data, int(length) if length else None)


@pytest.mark.parametrize("encoding", ["json", "binary"])
def test_digits_body_has_the_declared_shape_and_batch(encoding):
    body = body_for(DIGITS, encoding=encoding, batch=3, seed=1)
    request = decode(body)
    (x,) = request.inputs
    assert x.name == "X" and x.datatype == "FP32" and x.data.shape == (3, 64)  # -1 -> batch 3
    assert body.rows == 3
    assert float(x.data.min()) >= 0 and float(x.data.max()) < 1


def test_json_and_binary_carry_the_same_values():
    a = decode(body_for(DIGITS, encoding="json", batch=2, seed=5)).inputs[0].data
    b = decode(body_for(DIGITS, encoding="binary", batch=2, seed=5)).inputs[0].data
    assert np.array_equal(a, b)


def test_binary_layout_is_header_then_raw_bytes():
    body = body_for(DIGITS, encoding="binary", batch=2)
    head_len = int(body.headers["inference-header-content-length"])
    header = json.loads(body.data[:head_len])
    assert header["inputs"][0]["parameters"]["binary_data_size"] == 2 * 64 * 4  # 512 bytes of FP32
    assert len(body.data) == head_len + 512
    assert body.headers["content-type"] == "application/octet-stream"


@pytest.mark.parametrize("datatype, dtype", [("INT64", np.int64), ("UINT8", np.uint8), ("FP16", np.float16),
                                             ("FP64", np.float64), ("BOOL", np.bool_), ("INT32", np.int32)])
@pytest.mark.parametrize("encoding", ["json", "binary"])
def test_every_numeric_datatype(datatype, dtype, encoding):
    meta = {"name": "m", "inputs": [{"name": "a", "datatype": datatype, "shape": [2, -1, 3]}]}
    (a,) = decode(body_for(meta, encoding=encoding, batch=4)).inputs
    assert a.datatype == datatype and a.data.shape == (2, 4, 3) and a.data.dtype == dtype


@pytest.mark.parametrize("encoding", ["json", "binary"])
def test_bytes_inputs(encoding):
    meta = {"name": "m", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}]}
    body = body_for(meta, encoding=encoding, batch=2)
    (t,) = decode(body).inputs
    assert [bytes(v) if not isinstance(v, str) else v.encode() for v in t.data.reshape(-1)] == [b"text 0", b"text 1"]
    if encoding == "binary":  # each element: 4-byte little-endian length, then the bytes
        head = int(body.headers["inference-header-content-length"])
        assert body.data[head:] == struct.pack("<I", 6) + b"text 0" + struct.pack("<I", 6) + b"text 1"


def test_several_inputs_in_order():
    meta = {"name": "m", "inputs": [{"name": "ids", "datatype": "INT64", "shape": [-1, 8]},
                                    {"name": "mask", "datatype": "INT64", "shape": [-1, 8]}]}
    request = decode(body_for(meta, encoding="binary", batch=2))
    assert [t.name for t in request.inputs] == ["ids", "mask"]


@pytest.mark.parametrize("meta, kwargs, message", [
    ({"name": "m", "inputs": []}, {}, "declares no inputs"),
    ({"name": "m"}, {}, "declares no inputs"),
    ({"name": "m", "inputs": [{"name": "a", "datatype": "FP8", "shape": [1]}]}, {}, "datatype 'FP8'"),
    ({"name": "m", "inputs": [{"name": "a", "datatype": "FP32", "shape": "1x2"}]}, {}, "shape '1x2'"),
    ({"name": "m", "inputs": [{"name": "a", "datatype": "FP32", "shape": [-2]}]}, {}, r"shape \[-2\]"),
    (DIGITS, {"encoding": "xml"}, "unknown encoding 'xml'"),
    (DIGITS, {"batch": 0}, "batch=0"),
])
def test_what_cannot_be_built_is_a_clear_error(meta, kwargs, message):
    with pytest.raises(ValueError, match=message):
        body_for(meta, **kwargs)
