"""Every loader behind a real replica: a Nuclio-style handler and a KServe custom model
called the same way as the ONNX model (tritonclient and KServe's REST client),
scikit-learn pickles only with --trust, the emulated profile, TorchScript, and
graceful shutdown on SIGTERM; a stopped replica leaves no stderr file behind."""

from __future__ import annotations

import asyncio
import json
import pickle
import signal
import tempfile
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from functions.examples.digits import digits_data
from tests.conftest import EXAMPLES, start_replica

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def centroid_digits():
    """What both example functions compute, computed here directly."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    centroids = np.stack([digits.data[digits.target == d].mean(axis=0) for d in range(10)]).astype(np.float32)
    x = digits.data[:12].astype(np.float32)
    expected = ((x[:, None, :] - centroids[None]) ** 2).sum(axis=2).argmin(axis=1)
    return x, expected


def _triton_digit(replica, name, input_name, x, binary):
    client = triton.InferenceServerClient(replica.hostport)
    tensor = triton.InferInput(input_name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    result = client.infer(name, [tensor], outputs=[triton.InferRequestedOutput("digit", binary_data=binary)])
    return result.as_numpy("digit")


def _kserve(replica, name, protocol, payload):
    from kserve import InferenceRESTClient, RESTConfig

    async def call():
        client = InferenceRESTClient(RESTConfig(protocol=protocol, retries=0))
        try:
            return await client.infer(replica.url, payload, model_name=name)
        finally:
            await client.close()

    return asyncio.run(call())


def _kserve_v2_request(name, input_name, x):
    from kserve import InferInput, InferRequest

    tensor = InferInput(input_name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=False)
    return InferRequest(model_name=name, infer_inputs=[tensor])


@pytest.mark.parametrize(
    "artifact,input_name,platform",
    [("digits_handler.py", "pixels", "nuclio_python"), ("digits_kserve.py", "pixels", "kserve_custom")],
    ids=["nuclio-handler", "kserve-custom-model"],
)
def test_user_code_functions_served_like_onnx(artifact, input_name, platform, centroid_digits, replica_factory):
    x, expected = centroid_digits
    replica = replica_factory(EXAMPLES / artifact, "--name", "digits")
    meta = httpx.get(f"{replica.url}/v2/models/digits").json()
    assert meta["platform"] == platform

    for binary in (False, True):
        np.testing.assert_array_equal(_triton_digit(replica, "digits", input_name, x, binary), expected)

    v2 = _kserve(replica, "digits", "v2", _kserve_v2_request("digits", input_name, x))
    np.testing.assert_array_equal({o.name: o.as_numpy() for o in v2.outputs}["digit"], expected)

    v1 = _kserve(replica, "digits", "v1", {"instances": x.tolist()})
    assert v1["predictions"] == expected.tolist()


def test_handler_status_is_kept(replica_factory):
    """A Nuclio handler's own 4xx response reaches the client with its status."""
    replica = replica_factory(EXAMPLES / "digits_handler.py", "--name", "digits")
    r = httpx.post(f"{replica.url}/v1/models/digits:predict", json={"instances": []})
    assert r.status_code == 400 and "no instances" in r.json()["error"]


ECHO_HANDLER = """
import numpy as np

def handler(context, event):
    if isinstance(event.body, dict) and all(isinstance(v, np.ndarray) for v in event.body.values()) and event.body:
        return {"y": event.body["x"] * 2}  # V2: {input name: array}
    return {"got": event.body, "type": type(event.body).__name__}
"""


def _invoke(replica, *argv: str) -> int:
    from deploy.cli.commands import invoke

    # the replica serves the same paths the gateway forwards unchanged
    return invoke(["echo", *argv, "--url", replica.url, "--token", "unused"])


@pytest.fixture
def echo(tmp_path, replica_factory):
    handler = tmp_path / "echo.py"
    handler.write_text(ECHO_HANDLER)
    return replica_factory(handler, "--name", "echo")


@pytest.mark.parametrize("sent, printed", [
    ('{"text": "hi"}', {"got": {"text": "hi"}, "type": "dict"}),
    ('[1, 2]', {"got": [1, 2], "type": "list"}),
    ('"hi"', {"got": "hi", "type": "str"}),
], ids=["object", "list", "string"])
def test_shoal_invoke_json_reaches_a_handler_as_event_body(echo, capsys, sent, printed):
    assert _invoke(echo, "--json", sent) == 0
    assert json.loads(capsys.readouterr().out) == printed


def test_shoal_invoke_data_still_sends_v2_tensors_to_a_handler(echo, capsys):
    assert _invoke(echo, "--data", '{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}') == 0
    assert json.loads(capsys.readouterr().out)["outputs"][0]["data"] == [2.0, 4.0]  # [1, 2] * 2


@pytest.mark.parametrize("data", ['{"text": "hi"}', '[1, 2]'], ids=["plain-object", "list"])
def test_shoal_invoke_data_without_tensors_is_refused_with_a_hint(capsys, data):
    from deploy.cli.commands import invoke

    assert invoke(["echo", "--data", data, "--url", "http://127.0.0.1:9"]) == 2  # nothing is sent
    assert "send other JSON to a handler (as its event.body) with --json" in capsys.readouterr().err


def test_handler_validates_declared_inputs(replica_factory):
    replica = replica_factory(EXAMPLES / "digits_handler.py", "--name", "digits")
    body = {"inputs": [{"name": "pixels", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
    r = httpx.post(f"{replica.url}/v2/models/digits/infer", json=body)
    assert r.status_code == 400 and "expects [-1, 64]" in r.json()["error"]


@pytest.fixture(scope="module")
def sklearn_pickle(tmp_path_factory):
    import joblib
    from sklearn.linear_model import LogisticRegression

    x, y = digits_data()
    model = LogisticRegression(max_iter=2000).fit(x.astype(np.float64), y)
    path = tmp_path_factory.mktemp("sk") / "digits.joblib"
    joblib.dump(model, path)
    return path, model


class _Touch:
    """A pickle that creates a file when unpickled: proof of whether it was opened."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_pickle_refused_before_it_is_opened(tmp_path, replica_factory):
    marker = tmp_path / "was-unpickled"
    artifact = tmp_path / "evil.pkl"
    artifact.write_bytes(pickle.dumps(_Touch(str(marker))))
    replica = replica_factory(artifact, "--name", "evil", wait_ready=False)
    assert replica.proc.wait(30) == 3
    assert "refused without --trust" in replica.stderr_text()
    assert not marker.exists()


def test_sklearn_with_trust(sklearn_pickle, replica_factory):
    path, model = sklearn_pickle
    replica = replica_factory(path, "--name", "digits-sk", "--trust")
    x = digits_data()[0][:8].astype(np.float64)
    client = triton.InferenceServerClient(replica.hostport)
    tensor = triton.InferInput("input-0", list(x.shape), "FP64")
    tensor.set_data_from_numpy(x, binary_data=True)
    result = client.infer("digits-sk", [tensor])
    np.testing.assert_array_equal(result.as_numpy("output-0"), model.predict(x))
    np.testing.assert_allclose(result.as_numpy("predict_proba"), model.predict_proba(x), rtol=1e-12)
    v1 = httpx.post(f"{replica.url}/v1/models/digits-sk:predict", json={"instances": x.tolist()}).json()
    assert v1["predictions"] == model.predict(x).tolist()


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not found")


def test_emulated_profile_is_labelled_and_accounts_busy_time(replica_factory):
    replica = replica_factory(
        EXAMPLES / "emulated_resnet.yaml", "--name", "resnet", "--device", "emulated:0", "--slice", "1/8"
    )
    assert "(emulated device)" in replica.banner
    meta = httpx.get(f"{replica.url}/v2/models/resnet").json()
    assert meta["platform"] == "shoal_emulated" and meta["properties"]["emulated"] == "true"
    body = {"inputs": [{"name": "image", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": [0.0] * 192}]}
    start = time.perf_counter()
    for _ in range(10):
        r = httpx.post(f"{replica.url}/v2/models/resnet/infer", json=body)
        assert r.status_code == 200 and r.json()["outputs"][0]["shape"] == [1, 10]
    wall = time.perf_counter() - start
    metrics = httpx.get(f"{replica.url}/metrics").text
    assert 'shoal_replica_info{device="emulated:0",emulated="true",function="resnet",slice="1/8"} 1.0' in metrics
    busy = _metric(metrics, 'shoal_replica_busy_seconds_total{function="resnet"}')
    # 10 sequential batches of 1 row at 4.0 ms each = 0.040 s of service time, slept not burned
    assert 0.040 <= busy < wall
    assert _metric(metrics, 'shoal_replica_batch_size_count{function="resnet"}') == 10


def test_emulated_profile_on_a_smaller_slice_than_measured_runs_slower(tmp_path, replica_factory):
    """A replica the autoscaler resized to 1/8 of a function deployed at 1/4 (deploy.local passes
    --profile-slice) sleeps its profile's 40 ms x 1/4 / 1/8 = 80 ms a batch of one, as the
    simulator runs it; at its deployed slice, the profile's own 40 ms."""
    profile = tmp_path / "p.yaml"
    profile.write_text(
        "kind: profile\ninputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
        "outputs: [{name: y, datatype: FP32, shape: [-1]}]\nlatency_ms: {1: 40}\n"
    )
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}
    busy = {}
    for args in (("--slice", "1/8", "--profile-slice", "1/4"), ("--slice", "1/4", "--profile-slice", "1/4")):
        replica = replica_factory(profile, "--name", "p", "--device", "emulated:0", *args)
        for _ in range(5):
            assert httpx.post(f"{replica.url}/v2/models/p/infer", json=body).status_code == 200
        busy[args[1]] = _metric(httpx.get(f"{replica.url}/metrics").text, 'shoal_replica_busy_seconds_total{function="p"}')
    assert 0.40 <= busy["1/8"] < 0.55, busy  # 5 x 80 ms, slept
    assert 0.20 <= busy["1/4"] < 0.30, busy  # 5 x 40 ms


def test_a_profile_slice_that_is_no_slice_is_refused(replica_factory):
    with pytest.raises(RuntimeError, match=r"rc=2\): shoal replica: slice 'a quarter' is invalid"):
        replica_factory(EXAMPLES / "emulated_resnet.yaml", "--name", "resnet", "--profile-slice", "a quarter")


def test_sigterm_finishes_in_flight_request_then_exits_0(tmp_path, replica_factory):
    profile = tmp_path / "slow.yaml"
    profile.write_text(
        "kind: profile\ninputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
        "outputs: [{name: y, datatype: FP32, shape: [-1]}]\nlatency_ms: {1: 800}\n"
    )
    replica = replica_factory(profile, "--name", "slow")
    result = {}

    def call():
        body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}
        result["r"] = httpx.post(f"{replica.url}/v2/models/slow/infer", json=body, timeout=30)

    worker = threading.Thread(target=call)
    worker.start()
    deadline = time.monotonic() + 10
    while _metric(httpx.get(f"{replica.url}/metrics").text, 'shoal_replica_inflight{function="slow"}') < 1:
        assert time.monotonic() < deadline, "request never arrived"
        time.sleep(0.01)
    replica.proc.send_signal(signal.SIGTERM)
    worker.join(30)
    assert result["r"].status_code == 200
    assert replica.proc.wait(30) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{replica.url}/v2/health/live", timeout=2)


def test_load_failure_exits_with_reason(tmp_path, replica_factory):
    fake = tmp_path / "fake.onnx"
    fake.write_bytes(b"this is not onnx")
    replica = replica_factory(fake, "--name", "fake", wait_ready=False)
    assert replica.proc.wait(30) == 3
    assert "is not a loadable ONNX model" in replica.stderr_text()


def test_a_stopped_replica_leaves_no_stderr_file_but_keeps_its_text(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where start_replica's file goes
    (tmp_path / "tmp").mkdir()
    fake = tmp_path / "fake.onnx"
    fake.write_bytes(b"this is not onnx")
    replica = start_replica(fake, "--name", "fake", wait_ready=False)
    assert replica.proc.wait(30) == 3 and replica.stderr_path.parent == tmp_path / "tmp"
    assert replica.stop() == 3
    assert list((tmp_path / "tmp").iterdir()) == []
    assert "is not a loadable ONNX model" in replica.stderr_text()


def test_a_replica_that_fails_to_start_leaves_no_stderr_file(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    fake = tmp_path / "fake.onnx"
    fake.write_bytes(b"this is not onnx")
    with pytest.raises(RuntimeError, match="is not a loadable ONNX model"):
        start_replica(fake, "--name", "fake")
    assert list((tmp_path / "tmp").iterdir()) == []


def test_torchscript(tmp_path, replica_factory):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    module = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(64, 10), torch.nn.Softmax(dim=1)))
    path = tmp_path / "digits.pt"
    module.save(str(path))
    (tmp_path / "digits.pt.yaml").write_text(
        "inputs: [{name: X, datatype: FP32, shape: [-1, 64]}]\n"
        "outputs: [{name: probabilities, datatype: FP32, shape: [-1, 10]}]\n"
    )
    replica = replica_factory(path, "--name", "digits-pt")
    meta = httpx.get(f"{replica.url}/v2/models/digits-pt").json()
    assert meta["platform"] == "pytorch_libtorch" and meta["inputs"][0]["name"] == "X"
    x = digits_data()[0][:5]
    client = triton.InferenceServerClient(replica.hostport)
    tensor = triton.InferInput("X", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    got = client.infer("digits-pt", [tensor]).as_numpy("probabilities")
    with torch.inference_mode():
        want = module(torch.from_numpy(x)).numpy()
    # The replica runs torch on its slice's one thread, this process on all cores:
    # float32 sums in another order differ in the last bits (seen: 2e-6 relative).
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
