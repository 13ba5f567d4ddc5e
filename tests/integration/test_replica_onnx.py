"""The digits ONNX model behind a real replica process, called by clients Shoal did not write:
tritonclient.http (JSON with no Content-Type, and binary tensors) and KServe's REST client.
Outputs must equal calling onnxruntime directly on the same rows."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton

from functions.examples.digits import digits_data

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def digits_replica(digits_onnx):
    from tests.conftest import start_replica

    replica = start_replica(digits_onnx, "--name", "digits")
    yield replica
    assert replica.stop() == 0  # SIGTERM: graceful exit with status 0


@pytest.fixture(scope="module")
def direct(digits_onnx):
    session = ort.InferenceSession(str(digits_onnx), providers=["CPUExecutionProvider"])

    def run(x: np.ndarray) -> dict[str, np.ndarray]:
        label, probabilities = session.run(["label", "probabilities"], {"X": x})
        return {"label": label, "probabilities": probabilities}

    return run


@pytest.fixture(scope="module")
def rows():
    x, y = digits_data()
    return x[:16], y[:16]


@pytest.mark.parametrize("binary", [False, True], ids=["json-no-content-type", "binary-tensors"])
def test_tritonclient_infer_matches_onnxruntime(digits_replica, direct, rows, binary):
    x, _ = rows
    client = triton.InferenceServerClient(digits_replica.hostport)
    tensor = triton.InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("label", "probabilities")]
    result = client.infer("digits", [tensor], outputs=outputs, request_id="r-1")

    expected = direct(x)
    np.testing.assert_array_equal(result.as_numpy("label"), expected["label"])
    np.testing.assert_array_equal(result.as_numpy("probabilities"), expected["probabilities"])
    assert result.get_response()["id"] == "r-1"
    assert result.as_numpy("probabilities").dtype == np.float32


def test_tritonclient_sends_no_content_type_and_is_accepted(digits_replica, rows):
    """tritonclient's JSON request has no Content-Type (KServe's server fails there)."""
    x, _ = rows
    seen = {}

    def record(request: httpx.Request):
        seen["content-type"] = request.headers.get("content-type")

    tensor = triton.InferInput("X", [1, 64], "FP32")
    tensor.set_data_from_numpy(x[:1], binary_data=False)
    body, json_size = triton.InferenceServerClient.generate_request_body([tensor])
    assert json_size is None
    with httpx.Client(event_hooks={"request": [record]}) as c:
        request = c.build_request("POST", f"{digits_replica.url}/v2/models/digits/infer", content=body)
        request.headers.pop("content-type", None)
        response = c.send(request)
    assert seen["content-type"] is None
    assert response.status_code == 200, response.text


def test_tritonclient_metadata_and_health(digits_replica):
    client = triton.InferenceServerClient(digits_replica.hostport)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("digits") and client.is_model_ready("digits", "1")
    meta = client.get_model_metadata("digits")
    assert meta["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 64]}]
    assert meta["outputs"] == [
        {"name": "label", "datatype": "INT64", "shape": [-1]},
        {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]},
    ]
    assert meta["platform"] == "onnxruntime_onnx" and meta["versions"] == ["1"]
    assert meta["properties"]["emulated"] == "false"
    server = client.get_server_metadata()
    assert server["name"] == "shoal" and "binary_tensor_data" in server["extensions"]
    with pytest.raises(triton.InferenceServerException):
        client.get_model_metadata("digits", "7")  # unknown version: 404


def test_versioned_infer_path(digits_replica, direct, rows):
    x, _ = rows
    client = triton.InferenceServerClient(digits_replica.hostport)
    tensor = triton.InferInput("X", [2, 64], "FP32")
    tensor.set_data_from_numpy(x[:2])
    result = client.infer("digits", [tensor], model_version="1", outputs=[triton.InferRequestedOutput("label")])
    np.testing.assert_array_equal(result.as_numpy("label"), direct(x[:2])["label"])
    assert result.as_numpy("probabilities") is None  # only the requested output came back


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_kserve_rest_client_v2(digits_replica, direct, rows, binary):
    from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

    x, _ = rows

    async def call():
        client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0))
        try:
            assert await client.is_server_ready(digits_replica.url)
            assert await client.is_model_ready(digits_replica.url, "digits")
            tensor = InferInput("X", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            request = InferRequest(model_name="digits", infer_inputs=[tensor], request_id="k-1")
            return await client.infer(digits_replica.url, request, model_name="digits")
        finally:
            await client.close()

    response = asyncio.run(call())
    by_name = {o.name: o.as_numpy() for o in response.outputs}
    expected = direct(x)
    np.testing.assert_array_equal(by_name["label"], expected["label"])
    np.testing.assert_array_equal(by_name["probabilities"], expected["probabilities"])


def test_kserve_rest_client_v1(digits_replica, direct, rows):
    from kserve import InferenceRESTClient, RESTConfig

    x, _ = rows

    async def call():
        client = InferenceRESTClient(RESTConfig(protocol="v1", retries=0))
        try:
            assert await client.is_model_ready(digits_replica.url, "digits")
            return await client.infer(digits_replica.url, {"instances": x[:4].tolist()}, model_name="digits")
        finally:
            await client.close()

    predictions = asyncio.run(call())["predictions"]
    expected = direct(x[:4])
    assert [p["label"] for p in predictions] == expected["label"].tolist()
    np.testing.assert_array_equal(
        np.asarray([p["probabilities"] for p in predictions], dtype=np.float32), expected["probabilities"]
    )


def test_concurrent_requests_are_batched_and_answered_separately(digits_onnx, direct, replica_factory):
    """32 concurrent single-row requests to a replica that waits up to 20 ms to fill
    a batch of 8: every answer is its own row's, and batches held more than one row."""
    replica = replica_factory(digits_onnx, "--name", "digits", "--max-batch-size", "8", "--max-queue-delay-ms", "20")
    x, _ = digits_data()
    x = x[:32]

    async def one(client, i):
        body = {"inputs": [{"name": "X", "shape": [1, 64], "datatype": "FP32", "data": x[i].tolist()}]}
        r = await client.post(f"{replica.url}/v2/models/digits/infer", json=body)
        assert r.status_code == 200, r.text
        return r.json()["outputs"][0]["data"][0]

    async def all_():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    labels = asyncio.run(all_())
    assert labels == direct(x)["label"].tolist()
    metrics = httpx.get(f"{replica.url}/metrics").text
    count = _sample(metrics, 'shoal_replica_batch_size_count{function="digits"}')
    total = _sample(metrics, 'shoal_replica_batch_size_sum{function="digits"}')
    assert total == 32
    assert count < 32, f"{count} batches for 32 rows: nothing was batched"


def _sample(text: str, key: str) -> float:
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{key} not in metrics")
