"""Fuzzing the tensor codec (hypothesis): whatever arrives, decoding ends in a request or in an
InferenceError with a 4xx status and a message. Anything else would be a 500 from the replica.

Covered: bytes that are not JSON, JSON of every shape, random shapes (negative, zero, huge:
2**62 elements), every datatype and wrong ones, NaN and infinities, nested and ragged data,
truncated binary bodies, binary_data_size that lies, header lengths out of range."""

from __future__ import annotations

import json
import math
import os
import struct

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from serving.protocol.codec import decode_infer_request, parse_header_length
from serving.protocol.errors import InferenceError

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32",
             "FP64", "BYTES"]
# derandomize: the same examples on every run, so CI is not red by chance; run with
# SHOAL_FUZZ_RANDOM=1 (see below) to explore new ones, and pin what they find with @example
SETTINGS = settings(max_examples=int(os.environ.get("SHOAL_FUZZ_EXAMPLES", "400")), deadline=None,
                    derandomize=not os.environ.get("SHOAL_FUZZ_RANDOM"), database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def decodes_or_refuses(body: bytes, header_length: int | None) -> None:
    try:
        decode_infer_request(body, header_length)
    except InferenceError as exc:
        assert 400 <= exc.status < 500, (exc.status, exc.message)
        assert exc.message.strip()
    # any other exception escapes and fails the test: it would be a 500


@SETTINGS
@given(st.binary(max_size=512), st.one_of(st.none(), st.integers(min_value=1, max_value=600)))
def test_arbitrary_bytes(body, header_length):
    if header_length is not None and header_length > len(body):
        header_length = len(body) or None
    decodes_or_refuses(body, header_length)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20)


@SETTINGS
@given(json_values)
def test_any_json_document(doc):
    decodes_or_refuses(json.dumps(doc, allow_nan=True).encode(), None)


dims = st.integers(min_value=-3, max_value=2**62)
shapes = st.lists(dims, max_size=5) | st.just("3x4") | st.none()
scalars = (st.floats(allow_nan=True, allow_infinity=True) | st.integers(min_value=-2**66, max_value=2**66)
           | st.booleans() | st.text(max_size=4) | st.none())
data = st.lists(scalars | st.lists(scalars, max_size=3), max_size=12) | scalars


@SETTINGS
# found by this test in CI: an empty tensor whose other dimensions multiply past numpy's index range
@example([{"name": "0", "datatype": "BOOL", "shape": [0, 794, 226105, 226477, 226848], "data": []}])
@given(st.lists(st.fixed_dictionaries({"name": st.text(max_size=4) | st.none(),
                                        "datatype": st.sampled_from(DATATYPES) | st.text(max_size=5),
                                        "shape": shapes, "data": data}), min_size=1, max_size=3))
def test_tensors_of_random_shapes_datatypes_and_values(inputs):
    decodes_or_refuses(json.dumps({"inputs": inputs}, allow_nan=True).encode(), None)


@SETTINGS
@given(st.sampled_from(DATATYPES), st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=3),
       st.integers(min_value=-16, max_value=16), st.integers(min_value=0, max_value=64))
def test_binary_bodies_truncated_or_lying(datatype, shape, size_error, cut):
    n = int(np.prod(shape))
    if datatype == "BYTES":
        raw = b"".join(struct.pack("<I", 2) + b"ab" for _ in range(n))
    else:
        itemsize = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "UINT32": 4, "INT32": 4,
                    "FP32": 4}.get(datatype, 8)
        raw = b"\x01" * (n * itemsize)
    declared = max(0, len(raw) + size_error)
    header = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": shape,
                                     "parameters": {"binary_data_size": declared}}]}).encode()
    body = header + raw
    body = body[: max(len(header), len(body) - cut)]  # truncated, never into the header
    decodes_or_refuses(body, len(header))


@SETTINGS
@given(st.text(max_size=12), st.integers(min_value=0, max_value=100))
def test_header_length_values(value, body_len):
    try:
        length = parse_header_length(value, body_len)
    except InferenceError as exc:
        assert exc.status == 400
    else:
        assert length is not None and 0 < length <= body_len


def test_nan_and_infinity_inputs_are_values_not_errors():
    """FP32 inputs may be NaN or infinite (the model decides what they mean); JSON carries them as
    the non-standard NaN / Infinity tokens that many clients send."""
    body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [NaN, Infinity, -Infinity]}]}'
    try:
        request = decode_infer_request(body)
    except InferenceError as exc:
        assert exc.status == 400 and "JSON" in exc.message  # or refused as not JSON: a clear 400
    else:
        values = request.inputs[0].data
        assert math.isnan(values[0]) and values[1] == math.inf and values[2] == -math.inf
