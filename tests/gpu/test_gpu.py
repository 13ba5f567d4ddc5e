"""The real-GPU paths, on a machine with an NVIDIA GPU and PyTorch (skipped elsewhere: CI and the
development machines have none): NVML's inventory against nvidia-smi, a TorchScript replica on a
GPU slice (its answers against the CPU's, its CUDA memory capped to the slice's budget), the MPS
limits that a slice's environment sets when an MPS daemon runs, `shoal up --devices auto`
placing a function on the GPU and serving it from zero, and its replicas as MPS clients where a
daemon runs. `make test-gpu`; the runs are recorded in docs/gpu.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from deploy.local.inventory import discover_gpus
from tests.conftest import ROOT, start_plane, start_replica, wait_for

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not discover_gpus(), reason="no NVIDIA GPU found by NVML")]

MIB = 2**20


def _smi(*query: str) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def scorer(torch, tmp_path_factory):
    """A TorchScript module with a named input (X: 64 pixels -> 10 probabilities) and no sidecar,
    as `shoal deploy` uploads it (one file)."""

    class Scorer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(64, 10)

        def forward(self, X):
            return torch.softmax(self.linear(X), dim=1)

    torch.manual_seed(0)
    module = torch.jit.script(Scorer().eval())
    path = tmp_path_factory.mktemp("models") / "scorer.pt"
    module.save(str(path))
    x = np.random.default_rng(0).random((5, 64), dtype=np.float32)
    with torch.inference_mode():
        want = module(torch.from_numpy(x)).numpy()
    return path, x, want


def _infer_body(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "X", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()}]}


def _output(doc: dict) -> np.ndarray:
    out = doc["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def test_nvml_inventory_matches_nvidia_smi():
    gpus = discover_gpus()
    smi = _smi("--query-gpu=index,name,memory.total")
    assert [d.id for d in gpus] == [f"gpu:{row[0]}" for row in smi]
    assert [d.name for d in gpus] == [row[1] for row in smi]
    assert [d.memory_mib for d in gpus] == [int(row[2]) for row in smi]
    assert all(d.kind == "gpu" and not d.emulated for d in gpus)


def test_torchscript_replica_serves_from_its_gpu_slice(scorer):
    path, x, want = scorer
    replica = start_replica(path, "--device", "gpu:0", "--slice", "1/4:2048", "--name", "scorer")
    try:
        r = httpx.post(f"{replica.url}/v2/models/scorer/infer", json=_infer_body(x), timeout=60)
        assert r.status_code == 200, r.text
        # float32 on the GPU against the CPU: another summation order, the last bits differ
        np.testing.assert_allclose(_output(r.json()), want, rtol=1e-4, atol=1e-6)
        apps = {int(row[0]): int(row[1]) for row in _smi("--query-compute-apps=pid,used_memory")}
        assert replica.proc.pid in apps, f"the replica holds no CUDA context: {apps}"
        metrics = httpx.get(f"{replica.url}/metrics", timeout=10).text
        assert 'device="gpu:0"' in metrics and 'emulated="false"' in metrics
        bad = httpx.post(f"{replica.url}/v2/models/scorer/infer", timeout=10,
                         json={"inputs": [{"name": "X", "shape": [2, 64], "datatype": "FP32", "data": [1.0]}]})
        assert bad.status_code == 400 and "error" in bad.json()
        again = httpx.post(f"{replica.url}/v2/models/scorer/infer", json=_infer_body(x), timeout=60)
        assert again.status_code == 200  # a bad request leaves the slice serving
    finally:
        replica.stop(timeout=30)


_ALLOC_PROBE = """
import json, sys, torch
MIB = 2**20
held_mib, more_mib, budget_mib = (int(a) for a in sys.argv[1:4])
device = "cuda"
if budget_mib:  # the TorchScript loader, as a replica on a GPU slice with that budget loads it
    from serving.models.base import LoadOptions
    from serving.models.torchscript import TorchScriptModel
    model = TorchScriptModel("scorer", sys.argv[4], LoadOptions(device="gpu:0", gpu_mem_limit_mib=budget_mib))
    model.load()
    device = str(model.device)
held = torch.empty(held_mib * MIB, dtype=torch.uint8, device="cuda")
try:
    more = torch.empty(more_mib * MIB, dtype=torch.uint8, device="cuda")
    over = "allocated"
except torch.OutOfMemoryError as exc:
    over = "refused: " + str(exc).splitlines()[0]
props = torch.cuda.get_device_properties(0)
print(json.dumps({"device": device, "over": over, "sms": props.multi_processor_count,
                  "total_mib": props.total_memory // MIB}))
"""


def _alloc_probe(held_mib: int, more_mib: int, budget_mib: int = 0, model: str = "", env=None) -> dict:
    """In a process of its own (a CUDA memory fraction is per process): hold `held_mib` on the
    GPU, then try `more_mib` more; with `budget_mib`, after loading `model` under that budget."""
    done = subprocess.run([sys.executable, "-c", _ALLOC_PROBE, str(held_mib), str(more_mib), str(budget_mib), model],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_slice_budget_caps_the_replicas_cuda_memory(scorer):
    """A 1,024 MiB budget: 512 MiB fits, another 1,024 MiB (1,536 in all) is refused by torch's
    allocator, though the GPU has tens of GiB free."""
    path, _, _ = scorer
    seen = _alloc_probe(512, 1024, budget_mib=1024, model=str(path))
    assert seen["device"] == "cuda:0"
    assert seen["over"].startswith("refused"), seen
    assert seen["total_mib"] > 4096


def test_onnx_replica_runs_on_the_cuda_provider(request):
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip(f"this onnxruntime has no CUDA provider: {ort.get_available_providers()}")
    digits_onnx = request.getfixturevalue("digits_onnx")
    replica = start_replica(digits_onnx, "--device", "gpu:0", "--slice", "1/4:2048", "--name", "digits")
    try:
        x = np.zeros((2, 64), dtype=np.float32)
        r = httpx.post(f"{replica.url}/v2/models/digits/infer", json=_infer_body(x), timeout=60)
        assert r.status_code == 200, r.text
        apps = {int(row[0]) for row in _smi("--query-compute-apps=pid,used_memory")}
        assert replica.proc.pid in apps
    finally:
        replica.stop(timeout=30)


@pytest.fixture
def mps(tmp_path):
    """An MPS control daemon of this test's own (its pipe directory under tmp_path, so that only
    the processes given it are its clients), quit afterwards."""
    control = shutil.which("nvidia-cuda-mps-control")
    if not control:
        pytest.skip("no nvidia-cuda-mps-control on PATH")
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"),
           "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log")}
    (tmp_path / "pipe").mkdir()
    (tmp_path / "log").mkdir()
    started = subprocess.run([control, "-d"], env=env, capture_output=True, text=True, timeout=30)
    if started.returncode != 0:
        pytest.skip(f"the MPS control daemon did not start: {started.stdout}{started.stderr}")
    try:
        yield env
    finally:
        subprocess.run([control], input="quit\n", env=env, text=True, capture_output=True, timeout=30)
        log = tmp_path / "log" / "control.log"
        if log.exists():
            print(log.read_text()[-2000:])


def test_mps_enforces_the_slice_environment(mps):
    """The environment a 1/4:1024 slice gets (serving.executor.slice_env): under MPS the client
    sees a quarter of the SMs and cannot allocate past 1,024 MiB; without MPS, all of both."""
    pytest.importorskip("torch")
    from functions.spec import SliceRequest
    from serving.executor import bind_slice, slice_env

    env = {**mps, **slice_env(bind_slice(SliceRequest.parse("1/4:1024"), "gpu:0", None, os.cpu_count() or 1))}
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1024M"
    plain = {k: v for k, v in env.items() if not k.startswith("CUDA_MPS_PIPE")}
    seen = {name: _alloc_probe(256, 2048, env=e) for name, e in (("mps", env), ("plain", plain))}
    print(seen)
    assert seen["plain"]["over"] == "allocated"
    assert seen["mps"]["over"].startswith("refused"), seen
    assert seen["mps"]["sms"] < seen["plain"]["sms"], seen


def test_shoal_up_places_a_function_on_the_gpu_and_serves_it_from_zero(tmp_path, scorer):
    path, x, want = scorer
    plane = start_plane(tmp_path / "state", "--devices", "auto")
    try:
        with plane.client() as client:
            devices = {d["id"]: d for d in client.status()["devices"]}
            assert "gpu:0" in devices and not devices["gpu:0"]["emulated"], devices
            client.deploy(path, "scorer", slice="1/4:2048", idle_to_zero_s=3)
            assert client.status()["functions"]["scorer"]["replicas"] == []
            started = time.monotonic()
            r = client.invoke("scorer", _infer_body(x))
            cold_s = time.monotonic() - started
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(_output(r.json()), want, rtol=1e-4, atol=1e-6)
            assert "load=" in r.headers["shoal-cold-start"]
            replica = client.status()["functions"]["scorer"]["replicas"][0]
            assert replica["device"] == "gpu:0" and not replica["emulated"], replica
            print(f"cold start through the gateway: {cold_s:.2f} s ({r.headers['shoal-cold-start']})")
            warm = []
            for _ in range(20):
                t = time.monotonic()
                assert client.invoke("scorer", _infer_body(x)).status_code == 200
                warm.append(time.monotonic() - t)
            print(f"warm p50 {1000 * sorted(warm)[10]:.1f} ms over 20 requests")
            wait_for(lambda: client.status()["functions"]["scorer"]["replicas"] == [], 60, "scale to zero")
    finally:
        assert plane.stop() == 0


def test_shoal_up_replicas_run_as_mps_clients_when_a_daemon_runs(tmp_path, scorer, mps, monkeypatch):
    """Where an MPS daemon runs (shoal up starts none), the replicas shoal up starts are its
    clients: the slice's limits reach them through the zygote's fork (deploy.local.backend
    replica_env), two replicas at 1/2 share the GPU and answer right."""
    path, x, want = scorer
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        monkeypatch.setenv(key, mps[key])
    plane = start_plane(tmp_path / "state", "--devices", "auto")
    try:
        with plane.client() as client:
            client.deploy(path, "scorer", slice="1/2:4096", min_replicas=2, idle_to_zero_s=60)

            def both_ready() -> bool:
                replicas = client.status()["functions"]["scorer"]["replicas"]
                return len(replicas) == 2 and all(r["state"] == "ready" for r in replicas)

            wait_for(both_ready, 120, "two replicas ready")
            for _ in range(10):
                r = client.invoke("scorer", _infer_body(x))
                assert r.status_code == 200, r.text
                np.testing.assert_allclose(_output(r.json()), want, rtol=1e-4, atol=1e-6)
            assert {r["device"] for r in client.status()["functions"]["scorer"]["replicas"]} == {"gpu:0"}
        log = (Path(mps["CUDA_MPS_LOG_DIRECTORY"]) / "control.log").read_text()
        clients = set(re.findall(r"NEW CLIENT (\d+)", log))
        print(f"MPS clients: {sorted(clients)}")
        assert len(clients) >= 2, log[-2000:]
        servers = subprocess.run(["nvidia-cuda-mps-control"], input="get_server_list\n", env=mps, text=True,
                                 capture_output=True, timeout=30).stdout.split()
        assert servers, "no MPS server while two replicas ran"
    finally:
        assert plane.stop() == 0
