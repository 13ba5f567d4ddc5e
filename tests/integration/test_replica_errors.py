"""Bad input over real HTTP: every bad request gets the protocol's {"error": ...} with a
message naming the value, nothing crashes or wedges the replica, a model that raises
gives 500 and the replica keeps serving, overload is 503 with Retry-After."""

from __future__ import annotations

import asyncio
import gzip
import json
import textwrap
import time

import httpx
import pytest

pytestmark = pytest.mark.integration

ROW = [0.0] * 64


@pytest.fixture(scope="module")
def digits(digits_onnx):
    from tests.conftest import start_replica

    replica = start_replica(digits_onnx, "--name", "digits", "--max-body-mib", "0.5")
    yield replica
    replica.stop()


def _infer(inputs, **extra) -> bytes:
    return json.dumps({"inputs": inputs, **extra}).encode()


X1 = {"name": "X", "shape": [1, 64], "datatype": "FP32", "data": ROW}

BAD = [
    # id, method, path, body, headers, status, fragment
    ("wrong-datatype", "POST", "/v2/models/digits/infer",
     _infer([{**X1, "datatype": "FP64"}]), {}, 400, "has datatype FP64 but model 'digits' expects FP32"),
    ("shape-vs-model", "POST", "/v2/models/digits/infer",
     _infer([{**X1, "shape": [1, 63], "data": ROW[:63]}]), {}, 400, "has shape [1, 63] but model 'digits' expects [-1, 64]"),
    ("shape-vs-data", "POST", "/v2/models/digits/infer",
     _infer([{**X1, "shape": [2, 64]}]), {}, 400, "needs 128 values but 'data' has 64"),
    ("missing-input", "POST", "/v2/models/digits/infer", _infer([]), {}, 400, "missing input(s) 'X' (FP32 [-1, 64])"),
    ("unknown-input", "POST", "/v2/models/digits/infer",
     _infer([X1, {**X1, "name": "Y"}]), {}, 400, "unknown input 'Y'; model 'digits' expects 'X'"),
    ("unknown-output", "POST", "/v2/models/digits/infer",
     _infer([X1], outputs=[{"name": "nope"}]), {}, 400, "unknown output 'nope'"),
    ("non-json", "POST", "/v2/models/digits/infer", b"hello", {}, 400, "not valid JSON"),
    ("truncated-binary", "POST", "/v2/models/digits/infer",
     json.dumps({"inputs": [{"name": "X", "shape": [1, 64], "datatype": "FP32",
                             "parameters": {"binary_data_size": 256}}]}).encode() + b"\0" * 100,
     {"Inference-Header-Content-Length": None}, 400, "only 100 bytes of binary data remain"),
    ("header-length-not-int", "POST", "/v2/models/digits/infer", _infer([X1]),
     {"Inference-Header-Content-Length": "x"}, 400, "Inference-Header-Content-Length 'x' is not an integer"),
    ("unknown-model", "POST", "/v2/models/nope/infer", _infer([X1]), {}, 404, "model 'nope' not found"),
    ("unknown-version", "POST", "/v2/models/digits/versions/9/infer", _infer([X1]), {}, 404, "version '9' not found"),
    ("unknown-model-v1", "POST", "/v1/models/nope:predict", b'{"instances": []}', {}, 404, "model 'nope' not found"),
    ("v1-without-instances", "POST", "/v1/models/digits:predict", b'{"rows": []}', {}, 400, "needs 'instances'"),
    ("v1-wrong-width", "POST", "/v1/models/digits:predict", b'{"instances": [[1, 2]]}', {}, 400,
     "has shape [1, 2] but model 'digits' expects [-1, 64]"),
    ("get-on-infer", "GET", "/v2/models/digits/infer", b"", {}, 405, "use POST"),
    ("v1-explain-unsupported", "POST", "/v1/models/digits:explain", b"{}", {}, 404, "no route"),
    ("unknown-route", "GET", "/v3/whatever", b"", {}, 404, "no route"),
    ("bad-gzip", "POST", "/v2/models/digits/infer", b"not gzip", {"Content-Encoding": "gzip"}, 400, "not valid gzip"),
    ("truncated-gzip", "POST", "/v2/models/digits/infer", gzip.compress(b'{"inputs": []}')[:-6],
     {"Content-Encoding": "gzip"}, 400, "not a complete gzip stream"),
    ("unknown-encoding", "POST", "/v2/models/digits/infer", b"x", {"Content-Encoding": "br"}, 415, "'br' is not supported"),
    ("over-size-limit", "POST", "/v2/models/digits/infer", b" " * (600 * 1024), {}, 413, "exceeds the limit"),
]


@pytest.mark.parametrize("method,path,body,headers,status,fragment", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_request_gets_protocol_error(digits, method, path, body, headers, status, fragment):
    headers = dict(headers)
    if headers.get("Inference-Header-Content-Length", "") is None:
        headers["Inference-Header-Content-Length"] = str(body.index(b"\0"))
    r = httpx.request(method, digits.url + path, content=body or None, headers=headers, timeout=10)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert fragment in r.json()["error"]


def test_replica_still_serves_after_bad_input(digits):
    for case in BAD:
        httpx.request(case[1], digits.url + case[2], content=case[3] or None, timeout=10)
    assert digits.proc.poll() is None
    r = httpx.post(f"{digits.url}/v2/models/digits/infer", content=_infer([X1]), timeout=10)
    assert r.status_code == 200
    metrics = httpx.get(f"{digits.url}/metrics").text
    assert 'shoal_replica_requests_total{code="400",function="digits"}' in metrics


def test_gzip_request_body_is_accepted(digits):
    r = httpx.post(
        f"{digits.url}/v2/models/digits/infer", content=gzip.compress(_infer([X1])),
        headers={"Content-Encoding": "gzip"}, timeout=10,
    )
    assert r.status_code == 200, r.text


def test_chunked_body_over_limit_is_413(digits):
    def chunks():
        for _ in range(10):
            yield b" " * (100 * 1024)  # 10 x 100 KiB, no Content-Length, limit 512 KiB

    r = httpx.post(f"{digits.url}/v2/models/digits/infer", content=chunks(), timeout=10)
    assert r.status_code == 413


def test_model_that_raises_gives_500_and_replica_keeps_serving(tmp_path, replica_factory):
    handler = tmp_path / "flaky.py"
    handler.write_text(textwrap.dedent("""
        import numpy as np
        INPUTS = [{"name": "x", "datatype": "FP32", "shape": [-1]}]

        def handler(context, event):
            x = event.body["x"]
            if (x < 0).any():
                raise ValueError(f"negative input {x.min()}")
            return {"y": x * 2}
    """))
    replica = replica_factory(handler, "--name", "flaky")
    url = f"{replica.url}/v2/models/flaky/infer"

    def call(values):
        return httpx.post(url, json={"inputs": [{"name": "x", "shape": [len(values)], "datatype": "FP32", "data": values}]})

    bad = call([-1.0])
    assert bad.status_code == 500
    assert "ValueError: negative input -1.0" in bad.json()["error"]
    good = call([1.0, 2.5])
    assert good.status_code == 200 and good.json()["outputs"][0]["data"] == [2.0, 5.0]


PROFILE = """
kind: profile
inputs: [{name: x, datatype: FP32, shape: [-1, 2]}]
outputs: [{name: y, datatype: FP32, shape: [-1, 3]}]
latency_ms: {1: %s}
"""


def test_full_queue_answers_503_with_retry_after(tmp_path, replica_factory):
    profile = tmp_path / "slow.yaml"
    profile.write_text(PROFILE % 1000)  # long enough that all six overlap even on a loaded machine
    replica = replica_factory(profile, "--name", "slow", "--max-queue", "1", "--max-batch-size", "1")
    body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}

    async def burst():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(
                *(client.post(f"{replica.url}/v2/models/slow/infer", json=body) for _ in range(6))
            )

    responses = asyncio.run(burst())
    codes = sorted(r.status_code for r in responses)
    # 1 runs and up to 1 waits in the queue of 1; the rest are refused at once. How many arrive while
    # the first still runs depends on timing (in CI all six once came before the first left the queue,
    # so the second was refused too): at least one served, at least one refused, nothing else.
    assert codes.count(200) >= 1 and codes.count(503) >= 1 and set(codes) <= {200, 503}, codes
    refused = [r for r in responses if r.status_code == 503]
    assert all(r.headers["retry-after"] == "1" and "queue is full" in r.json()["error"] for r in refused)


def test_slow_model_times_out_with_504(tmp_path, replica_factory):
    profile = tmp_path / "slower.yaml"
    profile.write_text(PROFILE % 2000)
    replica = replica_factory(profile, "--name", "slower", "--request-timeout-s", "0.3")
    body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    r = httpx.post(f"{replica.url}/v2/models/slower/infer", json=body, timeout=10)
    assert r.status_code == 504 and "request timeout (0.3 s)" in r.json()["error"]


def test_405_names_the_allowed_methods(digits):
    r = httpx.get(f"{digits.url}/v2/models/digits/infer")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    r = httpx.post(f"{digits.url}/v2/health/ready")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"


def test_binary_data_output_applies_to_listed_outputs(digits):
    body = _infer([X1], outputs=[{"name": "label"}], parameters={"binary_data_output": True})
    r = httpx.post(f"{digits.url}/v2/models/digits/infer", content=body)
    length = int(r.headers["inference-header-content-length"])
    header = json.loads(r.content[:length])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 8  # one INT64 label
    assert len(r.content) == length + 8


def test_live_before_ready_and_503_while_loading(tmp_path, replica_factory):
    profile = tmp_path / "slowload.yaml"
    profile.write_text(PROFILE % 1 + "load_s: 1.5\n")
    replica = replica_factory(profile, "--name", "slowload", wait_ready=False)
    base = replica.url
    deadline = time.monotonic() + 30
    while True:  # the listener is up before the model
        try:
            if httpx.get(f"{base}/v2/health/live").status_code == 200:
                break
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert httpx.get(f"{base}/v2/health/ready").status_code == 503
    assert httpx.get(f"{base}/v2/models/slowload/ready").status_code == 503
    body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    r = httpx.post(f"{base}/v2/models/slowload/infer", json=body)
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and "still loading" in r.json()["error"]
    while httpx.get(f"{base}/v2/health/ready").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert httpx.post(f"{base}/v2/models/slowload/infer", json=body).status_code == 200
