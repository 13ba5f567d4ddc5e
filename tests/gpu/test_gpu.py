"""The real-GPU paths, on a machine with an NVIDIA GPU and PyTorch (skipped elsewhere: CI and the
development machines have none): NVML's inventory against nvidia-smi, a TorchScript replica on a
GPU slice (its answers against the CPU's, its CUDA memory capped to the slice's budget), the MPS
limits that a slice's environment sets when an MPS daemon runs (read in a probe and inside
`shoal up`'s own replicas), `shoal up --devices auto` placing a function on the GPU and serving
it from zero, its replicas as MPS clients where a daemon runs, the duty cycle the autoscaler
scales on against NVML's utilization, the policy scaling a GPU function out and back to zero
(time-sliced), and the MPS daemon shoal up starts of its own making each slice its share of the
GPU's throughput, and a replica moved to the smaller slice its policy asks for getting that slice's
share under MPS.
`make test-gpu`; the runs are recorded in docs/gpu.md.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
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
from loadtests.bench.firstcall import matmuls_module, scorer_module
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
    """The bench's scorer (loadtests.bench.firstcall: X, 64 pixels -> 10 probabilities) with no
    sidecar, as `shoal deploy` uploads it (one file)."""
    module = scorer_module(torch)
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


@pytest.fixture
def own_mps(monkeypatch):
    """For a `shoal up` that starts an MPS daemon of its own (--mps auto): the control program on
    PATH (else skipped), and no daemon named in the environment."""
    if not shutil.which("nvidia-cuda-mps-control"):
        pytest.skip("no nvidia-cuda-mps-control on PATH")
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        monkeypatch.delenv(key, raising=False)


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
            # idle_to_zero_s 1: its cold start (seconds) misses the 100 ms SLO, so the keep-alive
            # prices it and keeps it up to 30 x 1 s while its gaps are few (docs/design/policy.md)
            client.deploy(path, "scorer", slice="1/4:2048", idle_to_zero_s=1)
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
    keys = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
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
    """The bench's matrix products (loadtests.bench.firstcall): milliseconds of GPU kernels per
    request, 16 products of 2,048 x 2,048 float32 matrices (17 GFLOP each), its answer a function
    of X."""
    path = tmp_path_factory.mktemp("models") / "matmuls.pt"
    matmuls_module(torch).save(str(path))
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


def _closed_loop(url: str, users: int, seconds: float, name: str = "matmuls",
                 pause_s: float = 0.0) -> tuple[dict[int, int], list[float]]:
    """`users` clients each sending the function `name` (the matmuls) a request `pause_s` after its
    last was answered, for `seconds`: the answers' status codes counted, and their latencies."""
    body = _infer_body(np.ones((1, 64), dtype=np.float32))

    async def run() -> tuple[dict[int, int], list[float]]:
        codes: dict[int, int] = {}
        latencies: list[float] = []
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=users)) as http:
            async def user():
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    t = time.perf_counter()
                    r = await http.post(f"{url}/v2/models/{name}/infer", json=body)
                    latencies.append(time.perf_counter() - t)
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1
                    await asyncio.sleep(pause_s)

            await asyncio.gather(*(user() for _ in range(users)))
        return codes, latencies

    return asyncio.run(run())


def test_shoal_up_scales_a_gpu_function_out_and_back_to_zero(tmp_path, matmuls):
    """The policy driving real GPU replicas, time-sliced (`--mps off`): one user from zero, then
    eight users back to back on the matmuls function (about 8 ms of GPU per request, one replica
    serves one at a time) at 1/4:4096, target two in flight per replica. Nothing fails while it
    scales; it scales out (the reason in its events) to several replicas on gpu:0, each holding a
    CUDA context of its own (under MPS the contexts are its server's); idle, back to zero, and the
    replicas' contexts are gone from the GPU."""

    def contexts() -> set[int]:
        return {int(row[0]) for row in _smi("--query-compute-apps=pid,used_memory")}

    before = contexts()
    plane = start_plane(tmp_path / "state", "--devices", "auto", "--mps", "off")
    try:
        with plane.client() as client:
            assert client.status()["gpu_sharing"] == {"mode": "time-sliced", "why": "--mps off"}
            # idle_to_zero_s 1: a priced cold start keeps it up to 30 x 1 s after the load
            client.deploy(matmuls, "matmuls", slice="1/4:4096", idle_to_zero_s=1, target_concurrency=2,
                          max_replicas=4, slo_ms=200.0)

            def closed_loop(users: int, seconds: float) -> tuple[dict[int, int], list[float]]:
                return _closed_loop(plane.url, users, seconds)

            codes, latencies = closed_loop(1, 8.0)  # from zero: one cold start
            print(f"1 user, 8 s: {codes}, first {1000 * latencies[0]:.0f} ms, then p50 "
                  f"{1000 * float(np.median(latencies[1:])):.1f} ms")
            assert set(codes) == {200}, codes
            codes, latencies = closed_loop(8, 12.0)
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


def test_shoal_up_starts_mps_so_that_a_slice_is_its_share_of_the_gpu(tmp_path, matmuls, own_mps):
    """With no MPS daemon named, `shoal up --devices auto` (--mps auto) starts one of its own: the
    GPU's sharing says mps; a handler at 1/4:1024 reads, inside its replica, that daemon's pipe, a
    quarter's share of the SMs, and 2 GiB more refused; the matmuls function at 1/4 (one request at
    a time per replica) serves at least 2.5 times as many requests a second on four replicas as on
    one, since each replica runs on its own quarter of the SMs (time-sliced, four served what one
    did: docs/gpu.md). When shoal up stops, its daemon is gone."""
    torch = pytest.importorskip("torch")
    all_sms = torch.cuda.get_device_properties(0).multi_processor_count
    probe = tmp_path / "slice_probe.py"
    probe.write_text(_SLICE_PROBE)
    before = {line.split(":")[0] for line in _mps_processes()}
    plane = start_plane(tmp_path / "state", "--devices", "auto")
    try:
        with plane.client() as client:
            status = client.status()
            print(f"GPU sharing: {status['gpu_sharing']}")
            assert status["gpu_sharing"]["mode"] == "mps", status["gpu_sharing"]
            assert {d["id"]: d.get("sharing") for d in status["devices"]}["gpu:0"] == "mps", status["devices"]
            client.deploy(probe, "quarter", slice="1/4:1024", idle_to_zero_s=60)
            r = client.invoke_json("quarter", {})
            assert r.status_code == 200, r.text
            seen = r.json()
            print(f"inside the replica: {json.dumps(seen)}")
            pipe = seen["env"]["CUDA_MPS_PIPE_DIRECTORY"]
            assert pipe and f"pipe {pipe}" in status["gpu_sharing"]["why"], (seen, status["gpu_sharing"])
            assert seen["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25", seen
            assert seen["sms"] <= all_sms // 4 + 2 and seen["over"].startswith("refused"), seen
            log = Path(seen["env"]["CUDA_MPS_LOG_DIRECTORY"]) / "control.log"
            assert seen["pid"] in {int(pid) for pid in re.findall(r"NEW CLIENT (\d+)", log.read_text())}
            client.delete("quarter")  # its slice back for the matmuls' fourth replica

            rates = {}
            for replicas in (1, 4):
                client.deploy(matmuls, "matmuls", slice="1/4:4096", min_replicas=replicas, max_replicas=replicas,
                              idle_to_zero_s=60, target_concurrency=1)

                def ready() -> bool:
                    states = [r["state"] for r in client.status()["functions"]["matmuls"]["replicas"]]
                    return states.count("ready") == replicas

                wait_for(ready, 120, f"{replicas} matmuls replica(s) ready",
                         detail=lambda: client.events("matmuls"))
                _closed_loop(plane.url, 2 * replicas, 1.0)  # each replica's first requests
                codes, latencies = _closed_loop(plane.url, 2 * replicas, 5.0)
                assert set(codes) == {200}, codes
                rates[replicas] = codes[200] / 5.0
                print(f"{replicas} replica(s) at 1/4 under MPS, {2 * replicas} users back to back: "
                      f"{rates[replicas]:.1f} requests/s, p50 {1000 * float(np.median(latencies)):.1f} ms")
            assert rates[4] >= 2.5 * rates[1], rates
    finally:
        assert plane.stop() == 0

    def started() -> list[str]:
        return [line for line in _mps_processes() if line.split(":")[0] not in before]

    wait_for(lambda: not started(), 20, "the MPS daemon and server shoal up started to quit with it", detail=started)


def _mps_processes() -> list[str]:
    """The MPS control daemons and servers running, as "pid: command line"."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if words and Path(words[0].decode(errors="replace")).name.startswith("nvidia-cuda-mps"):
            found.append(f"{cmdline.parent.name}: {b' '.join(words).decode(errors='replace')}")
    return found


def test_under_mps_a_busy_neighbour_leaves_a_functions_latency_alone(tmp_path, matmuls, own_mps):
    """Two functions on one GPU, each of the matmuls: `light` on one replica at 1/4, one user with a
    20 ms pause, and `heavy` on three at 1/4 (the rest of the GPU). Light's latency is measured with
    heavy idle, then while six users keep heavy's replicas busy. Under shoal up's MPS daemon light
    keeps its latency (p50 within 1.3x of its own alone): the slice is its share of the SMs. Time-
    sliced (`--mps off`, printed beside it, not asserted) light alone runs on the whole GPU, faster,
    and its latency rises with its neighbour's work."""
    pytest.importorskip("torch")
    seen = {}
    for mode in ("off", "auto"):
        plane = start_plane(tmp_path / f"state-{mode}", "--devices", "auto", "--mps", mode)
        try:
            with plane.client() as client:
                sharing = client.status()["gpu_sharing"]["mode"]
                assert sharing == ("mps" if mode == "auto" else "time-sliced"), sharing
                for name, replicas in (("light", 1), ("heavy", 3)):
                    client.deploy(matmuls, name, slice="1/4:4096", min_replicas=replicas, max_replicas=replicas,
                                  idle_to_zero_s=60, target_concurrency=1)
                for name, replicas in (("light", 1), ("heavy", 3)):
                    wait_for(lambda: [r["state"] for r in client.status()["functions"][name]["replicas"]]
                             .count("ready") == replicas, 120, f"{replicas} {name} replica(s) ready")
                    _closed_loop(plane.url, 2 * replicas, 1.0, name)  # each replica's first requests
                codes, alone = _closed_loop(plane.url, 1, 4.0, "light", pause_s=0.02)
                assert set(codes) == {200}, codes
                with concurrent.futures.ThreadPoolExecutor(1) as pool:
                    heavy = pool.submit(_closed_loop, plane.url, 6, 5.0, "heavy")
                    time.sleep(0.5)
                    codes, beside = _closed_loop(plane.url, 1, 4.0, "light", pause_s=0.02)
                    heavy_codes, heavy_latencies = heavy.result()
                assert set(codes) == {200}, codes
                # heavy kept its three replicas busy: six users, each answered within ~2 requests' time
                assert set(heavy_codes) == {200} and heavy_codes[200] >= 100, heavy_codes
                seen[sharing] = {"alone": 1000 * float(np.median(alone)), "beside": 1000 * float(np.median(beside))}
                print(f"{sharing}: light's p50 {seen[sharing]['alone']:.1f} ms alone, "
                      f"{seen[sharing]['beside']:.1f} ms beside heavy's six users ({heavy_codes[200]} "
                      f"requests in 5 s, p50 {1000 * float(np.median(heavy_latencies)):.1f} ms)")
        finally:
            assert plane.stop() == 0
    assert seen["mps"]["beside"] <= 1.3 * seen["mps"]["alone"], seen


_SLICE_SEEN = '''"""Its pid, and what its process sees of its GPU slice: the SMs and the MPS environment. CUDA
starts at load, as a model's weights go to the GPU then: a first request that took a second to
start it would read as a rise of need, which the policy remembers (reserve_memory_s) and will
not halve the slice under for minutes."""
import os

import torch

SEEN = {"pid": os.getpid(), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
        "percentage": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", ""),
        "pinned": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")}
torch.zeros(1, device="cuda")


def handler(context, event):
    return SEEN
'''


def test_under_mps_a_replica_moved_to_a_smaller_slice_gets_that_slices_share(tmp_path, own_mps):
    """A lone replica at 1/2 that answers a request every 0.5 s is idle enough that Shoal's policy
    asks half its slice (`--slice-window-s 15`: after 15 s of duty, not 300), and shoal up moves
    it (lending.to_move): a replica on 1/4 starts as a client of shoal up's MPS daemon, takes the
    traffic once ready, and the old one drains and exits. The new process sees the 1/4 slice's
    thread share (25 %) and about half the SMs the old one saw; every request is answered 200
    through the move."""
    torch = pytest.importorskip("torch")
    all_sms = torch.cuda.get_device_properties(0).multi_processor_count
    handler = tmp_path / "slice_seen.py"
    handler.write_text(_SLICE_SEEN)
    plane = start_plane(tmp_path / "state", "--devices", "auto", "--slice-window-s", "15")
    answers: list[tuple[int, dict | str]] = []
    stop = threading.Event()

    def trickle() -> None:
        with httpx.Client(base_url=plane.url, timeout=60) as http:
            while not stop.is_set():
                r = http.post("/v1/models/mover:predict", json={})
                answers.append((r.status_code, r.json() if r.status_code == 200 else r.text))
                time.sleep(0.5)

    sender = threading.Thread(target=trickle)
    try:
        with plane.client() as client:
            assert client.status()["gpu_sharing"]["mode"] == "mps"
            client.deploy(handler, "mover", slice="1/2", min_replicas=1, idle_to_zero_s=600, slo_ms=2000)
            wait_for(lambda: [r["state"] for r in client.status()["functions"]["mover"]["replicas"]] == ["ready"],
                     120, "mover ready")
            started = time.monotonic()
            sender.start()
            moves = wait_for(lambda: [e for e in client.events("mover") if e["kind"] == "slice" and "from" in e["data"]],
                             90, "a move to a smaller slice", detail=lambda: [e["message"] for e in client.events("mover")])
            new = moves[0]["data"]["replica"]
            wait_for(lambda: [r["id"] for r in client.status()["functions"]["mover"]["replicas"]] == [new], 90,
                     "the new replica alone", detail=lambda: client.status()["functions"]["mover"]["replicas"])
            moved_s = time.monotonic() - started
            replica = client.status()["functions"]["mover"]["replicas"][0]
            wait_for(lambda: any(code == 200 and a["percentage"] == "25" for code, a in answers[-2:]), 30,
                     "answers from the new replica")
            stop.set()
            sender.join(60)
            print(f"{moves[0]['message']}; the new replica alone {moved_s:.1f} s after the trickle began; "
                  f"{[e['message'] for e in client.events('mover')]}")
            assert replica["slice"] == "1/4" and replica["device"] == "gpu:0", replica
    finally:
        stop.set()
        if sender.is_alive():
            sender.join(60)
        assert plane.stop() == 0
    codes = collections.Counter(code for code, _ in answers)
    seen = {a["pid"]: (a["percentage"], a["pinned"], a["sms"]) for code, a in answers if code == 200}
    print(f"{dict(codes)} answers; by process (thread share, pinned memory, SMs): {seen}")
    assert set(codes) == {200}, answers
    old, moved = answers[0][1], answers[-1][1]
    assert old["percentage"] == "50" and moved["percentage"] == "25" and old["pid"] != moved["pid"], seen
    assert moved["sms"] <= all_sms // 4 + 2 and abs(2 * moved["sms"] - old["sms"]) <= 4, seen
    assert not Path(f"/proc/{old['pid']}").exists(), f"the old replica's process {old['pid']} still runs"


_FAULTING = '''"""Answers with its pid after a kernel on its GPU; on {"crash": true}, indexes past a tensor's end
on the GPU: a device-side assert, a fatal GPU exception, sticky for the process."""
import os

import torch


def handler(context, event):
    x = torch.zeros(4, device="cuda")
    if event.body.get("crash"):
        x[torch.tensor([1 << 20], device="cuda")] += 1
        torch.cuda.synchronize()
    return {"pid": os.getpid(), "sum": float(x.sum())}
'''


def test_a_real_gpu_fault_under_mps_replaces_the_replicas_it_reached(tmp_path, matmuls, own_mps):
    """Under shoal up's MPS daemon, a handler's device-side assert (a fatal GPU exception: sticky for
    its process; NVIDIA's MPS guide has it reach every client of the GPU's server, which takes no
    new client until those have exited): the faulting request gets a 500; the faulting replica exits
    (status 4) and is replaced, as is any other the fault reached; within 90 s both the faulting
    function and a bystander on the same GPU, sent a request every 100 ms, answer 200, the
    faulting one from a new process. (On the H200 lent, the bystander never failed.)"""
    pytest.importorskip("torch")
    faulting = tmp_path / "faulting.py"
    faulting.write_text(_FAULTING)
    plane = start_plane(tmp_path / "state", "--devices", "auto")
    try:
        with plane.client() as client:
            assert client.status()["gpu_sharing"]["mode"] == "mps"
            client.deploy(faulting, "faulting", slice="1/4:2048", min_replicas=1, idle_to_zero_s=120)
            client.deploy(matmuls, "matmuls", slice="1/4:4096", min_replicas=1, idle_to_zero_s=120)
            for name in ("faulting", "matmuls"):
                wait_for(lambda: [r["state"] for r in client.status()["functions"][name]["replicas"]] == ["ready"],
                         120, f"{name} ready")
            body = _infer_body(np.ones((1, 64), dtype=np.float32))
            before = client.invoke_json("faulting", {})
            assert before.status_code == 200, before.text
            assert client.invoke("matmuls", body).status_code == 200
            crashed = client.invoke_json("faulting", {"crash": True})
            print(f"the faulting request: {crashed.status_code} {crashed.text[:300]}")
            assert crashed.status_code == 500, crashed.text
            codes: dict[str, list[int]] = {"faulting": [], "matmuls": []}
            after = None
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                f = client.invoke_json("faulting", {})
                m = client.invoke("matmuls", body)
                codes["faulting"].append(f.status_code)
                codes["matmuls"].append(m.status_code)
                if f.status_code == 200 and m.status_code == 200 and f.json()["pid"] != before.json()["pid"]:
                    after = f.json()
                    break
                time.sleep(0.1)
            failed = [e["message"] for e in client.events() if e["kind"] == "replica_failed"]
            print(f"after the fault, until both answered 200: faulting {_runs(codes['faulting'])}, "
                  f"matmuls {_runs(codes['matmuls'])}; replicas failed: {failed}")
            assert after is not None, (codes, failed)
            assert any("exited with status 4" in m for m in failed), failed
    finally:
        assert plane.stop() == 0


def _runs(codes: list[int]) -> str:
    """200, 200, 503, 503, 503 as "2x200 3x503"."""
    out: list[list[int]] = []
    for code in codes:
        if out and out[-1][0] == code:
            out[-1][1] += 1
        else:
            out.append([code, 1])
    return " ".join(f"{n}x{code}" for code, n in out)
