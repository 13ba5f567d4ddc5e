"""The real-GPU paths, on a machine with an NVIDIA GPU and PyTorch (skipped elsewhere: CI and the
development machines have none): NVML's inventory against nvidia-smi, a TorchScript replica on a
GPU slice (its answers against the CPU's, its CUDA memory capped to the slice's budget), the MPS
limits that a slice's environment sets when an MPS daemon runs (read in a probe and inside
`shoal up`'s own replicas), `shoal up --devices auto` placing a function on the GPU and serving
it from zero, its replicas as MPS clients where a daemon runs, the duty cycle the autoscaler
scales on against NVML's utilization, and the policy scaling a GPU function out and back to zero.
`make test-gpu`; the runs are recorded in docs/gpu.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import threading
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


_SLICE_PROBE = '''"""What a replica's own process sees of its GPU slice: its SMs, and whether 2 GiB more than the
256 MiB it holds can be allocated."""
import os

import torch

MIB = 2**20


def handler(context, event):
    props = torch.cuda.get_device_properties(0)
    held = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
    try:
        more = torch.empty(2048 * MIB, dtype=torch.uint8, device="cuda")
        over = "allocated"
        del more
    except torch.OutOfMemoryError as exc:
        over = "refused: " + str(exc).splitlines()[0]
    del held
    torch.cuda.empty_cache()
    keys = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
    return {"pid": os.getpid(), "sms": props.multi_processor_count, "over": over,
            "env": {k: os.environ.get(k, "") for k in keys}}
'''


def test_the_slice_limits_hold_inside_shoal_ups_replica(tmp_path, mps, monkeypatch):
    """Under an MPS daemon, a Python handler deployed at 1/4:1024 reads, from inside the replica
    shoal up started: a quarter's share of the SMs, and 2 GiB more refused. The same handler at
    1/2 (no memory limit) on the same daemon sees twice the SMs and gets its 2 GiB, so the limits
    are each slice's, not the daemon's."""
    pytest.importorskip("torch")
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        monkeypatch.setenv(key, mps[key])
    probe = tmp_path / "slice_probe.py"
    probe.write_text(_SLICE_PROBE)
    plane = start_plane(tmp_path / "state", "--devices", "auto")
    try:
        with plane.client() as client:
            seen = {}
            for name, slice_ in (("quarter", "1/4:1024"), ("half", "1/2")):
                client.deploy(probe, name, slice=slice_, idle_to_zero_s=60)
                r = client.invoke_json(name, {})
                assert r.status_code == 200, r.text
                seen[name] = r.json()
                replica = client.status()["functions"][name]["replicas"][0]
                assert replica["device"] == "gpu:0" and not replica["emulated"], replica
            print(f"inside the replicas: {json.dumps(seen)}")
            quarter, half = seen["quarter"], seen["half"]
            assert quarter["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25", quarter
            assert quarter["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1024M", quarter
            assert half["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50", half
            assert quarter["over"].startswith("refused"), quarter
            assert half["over"] == "allocated", half
            # MPS hands out SMs by pairs (TPCs): a quarter's count is about half a half's
            assert quarter["sms"] < half["sms"] and abs(2 * quarter["sms"] - half["sms"]) <= 4, seen
        log = (Path(mps["CUDA_MPS_LOG_DIRECTORY"]) / "control.log").read_text()
        clients = {int(pid) for pid in re.findall(r"NEW CLIENT (\d+)", log)}
        assert {quarter["pid"], half["pid"]} <= clients, (clients, seen)
    finally:
        assert plane.stop() == 0


@pytest.fixture(scope="module")
def matmuls(torch, tmp_path_factory):
    """A TorchScript module that spends milliseconds of GPU kernels per request: 16 products of
    2,048 x 2,048 float32 matrices (17 GFLOP each), its answer a function of X."""

    class Matmuls(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(2048, 2048) / 45.0)

        def forward(self, X):
            h = self.w
            for _ in range(16):
                h = torch.tanh(h @ self.w)
            return X * h.mean()

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("models") / "matmuls.pt"
    torch.jit.script(Matmuls().eval()).save(str(path))
    return path


def _busy_seconds(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(r"^shoal_replica_busy_seconds_total\{[^}]*\} (\S+)$", text, re.M)
    assert found, text[-2000:]
    return float(found.group(1))


def _nvml_utilization(handle) -> list[tuple[int, int]]:
    """NVML's GPU-utilization samples it still holds: (timestamp in microseconds, percent of the
    sample period in which a kernel ran)."""
    import pynvml

    try:
        _, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    except pynvml.NVMLError_NotFound:
        return []
    return [(s.timeStamp, s.sampleValue.uiVal) for s in samples]


def test_the_duty_cycle_agrees_with_nvmls_count_of_kernel_time(matmuls):
    """The autoscaler scales on a slice's duty cycle, the rate of the replica's busy seconds (the
    time its executor spends in the model). With the replica alone on the GPU, that rate is read
    beside NVML's GPU utilization over the same seconds, at a light pace (one client, pausing
    20 ms between requests) and back to back (four clients): the two agree within 0.15 at each,
    and both rise between them."""
    import pynvml

    replica = start_replica(matmuls, "--device", "gpu:0", "--slice", "1/1", "--name", "matmuls")
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        body = _infer_body(np.ones((1, 64), dtype=np.float32))
        url = f"{replica.url}/v2/models/matmuls/infer"
        with httpx.Client(timeout=60) as http:
            for _ in range(5):  # cuBLAS's first call, the allocator's first blocks
                assert http.post(url, json=body).status_code == 200
            single = []
            for _ in range(10):
                t = time.perf_counter()
                http.post(url, json=body)
                single.append(time.perf_counter() - t)
        print(f"one request alone, p50 {1000 * sorted(single)[5]:.2f} ms at the client")

        def load(clients: int, pause_s: float, seconds: float) -> int:
            stop = time.monotonic() + seconds
            counts = [0] * clients

            def client(i: int) -> None:
                with httpx.Client(timeout=60) as http:
                    while time.monotonic() < stop:
                        assert http.post(url, json=body).status_code == 200
                        counts[i] += 1
                        time.sleep(pause_s)

            threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return sum(counts)

        read = {}
        for phase, clients, pause_s in (("light", 1, 0.020), ("back to back", 4, 0.0)):
            busy0, t0, wall0 = _busy_seconds(replica.url), time.monotonic(), time.time()
            requests = load(clients, pause_s, 6.0)
            busy1, t1, wall1 = _busy_seconds(replica.url), time.monotonic(), time.time()
            time.sleep(0.5)  # NVML's sampler, a sample period behind
            samples = _nvml_utilization(handle)
            # the samples inside the load's seconds (NVML stamps them in microseconds of the wall
            # clock), less one period at each end, which the load only partly covered
            inside = [u for ts, u in samples if 1e6 * (wall0 + 0.25) <= ts <= 1e6 * (wall1 - 0.25)]
            assert len(inside) >= 5, f"{len(inside)} of NVML's samples in the load's 6 s: {samples[-40:]}"
            read[phase] = {"requests": requests, "duty": (busy1 - busy0) / (t1 - t0),
                           "nvml": float(np.mean(inside)) / 100, "nvml_samples": len(inside)}
        print(f"duty cycle against NVML: {json.dumps(read)}")
        for phase, seen in read.items():
            assert abs(seen["duty"] - seen["nvml"]) <= 0.15, (phase, seen)
        assert read["back to back"]["duty"] > read["light"]["duty"] + 0.3, read
        assert read["back to back"]["nvml"] > read["light"]["nvml"] + 0.3, read
    finally:
        pynvml.nvmlShutdown()
        replica.stop(timeout=30)


def test_shoal_up_scales_a_gpu_function_out_and_back_to_zero(tmp_path, matmuls):
    """The policy driving real GPU replicas: one user from zero, then eight users back to back on
    the matmuls function (about 8 ms of GPU per request, one replica serves one at a time) at
    1/4:4096, target two in flight per replica. Nothing fails while it scales; it scales out (the
    reason in its events) to several replicas on gpu:0, each holding a CUDA context of its own;
    idle, back to zero, and the replicas' contexts are gone from the GPU."""
    body = _infer_body(np.ones((1, 64), dtype=np.float32))

    def contexts() -> set[int]:
        return {int(row[0]) for row in _smi("--query-compute-apps=pid,used_memory")}

    before = contexts()
    plane = start_plane(tmp_path / "state", "--devices", "auto")
    try:
        with plane.client() as client:
            client.deploy(matmuls, "matmuls", slice="1/4:4096", idle_to_zero_s=3, target_concurrency=2,
                          max_replicas=4, slo_ms=200.0)

            async def closed_loop(users: int, seconds: float) -> tuple[dict[int, int], list[float]]:
                codes: dict[int, int] = {}
                latencies: list[float] = []
                async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=users)) as http:
                    async def user():
                        end = time.monotonic() + seconds
                        while time.monotonic() < end:
                            t = time.perf_counter()
                            r = await http.post(f"{plane.url}/v2/models/matmuls/infer", json=body)
                            latencies.append(time.perf_counter() - t)
                            codes[r.status_code] = codes.get(r.status_code, 0) + 1

                    await asyncio.gather(*(user() for _ in range(users)))
                return codes, latencies

            codes, latencies = asyncio.run(closed_loop(1, 8.0))  # from zero: one cold start
            print(f"1 user, 8 s: {codes}, first {1000 * latencies[0]:.0f} ms, then p50 "
                  f"{1000 * float(np.median(latencies[1:])):.1f} ms")
            assert set(codes) == {200}, codes
            codes, latencies = asyncio.run(closed_loop(8, 12.0))
            replicas = client.status()["functions"]["matmuls"]["replicas"]
            pcts = np.percentile(np.asarray(latencies) * 1000, [50, 95, 99])
            print(f"8 users, 12 s: {codes}, p50/p95/p99 {pcts.round(1).tolist()} ms (cold starts included), "
                  f"{len(replicas)} replicas at the end")
            assert set(codes) == {200}, codes
            ups = [e for e in client.events("matmuls") if e["kind"] == "scale" and e["data"]["to"] > e["data"]["from"]]
            print("scale-ups: " + "; ".join(f"{e['data']['reason']}: {e['message']}" for e in ups))
            assert max(e["data"]["to"] for e in ups) >= 2, ups
            assert {e["data"]["reason"] for e in ups} <= {"BURST", "SLO", "FORECAST", "COLD_START", "RESERVE"}, ups
            assert {r["device"] for r in replicas} == {"gpu:0"}, replicas
            assert not any(r["emulated"] for r in replicas), replicas
            ready = [r for r in replicas if r["state"] == "ready"]
            held = contexts() - before
            print(f"{len(ready)} replicas ready, {len(held)} new CUDA contexts on the GPU")
            assert len(held) >= len(ready) >= 2, (held, replicas)
            wait_for(lambda: client.status()["functions"]["matmuls"]["replicas"] == [], 60, "scale to zero",
                     detail=lambda: client.events("matmuls"))
            downs = [e for e in client.events("matmuls") if e["kind"] == "scale" and e["data"]["to"] == 0]
            assert downs and downs[-1]["data"]["reason"] == "TO_ZERO", downs
            wait_for(lambda: not held & contexts(), 30, "the replicas' CUDA contexts to go")
    finally:
        assert plane.stop() == 0
