"""`shoal demo` (`make demo`): the platform story on the embedded default, start to finish.
It builds the digits model (scikit-learn's bundled data, to ONNX), starts `shoal up` on a free
loopback port (state in .shoal/demo) and deploys the model to scale to zero. It then shows a
first request's cold start by phase (held at the gateway, a replica forked from the zygote),
calls the function with tritonclient's binary tensors and KServe V1, scales it out on a burst
(a slice per replica) and back to zero when idle, restarts the control plane (the function is
still there and serves), and ends with a Locust spike into the function at zero, whose report
(latency against the SLO, replicas and decisions, cold starts, cost against a static peak
allocation) goes to .shoal/demo/report/.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from deploy.cli.client import Shoal


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="shoal demo", description=__doc__.splitlines()[0])
    p.add_argument("--state-dir", default=".shoal/demo", help="control-plane state for the demo (wiped first)")
    p.add_argument("--burst-s", type=float, default=8.0)
    p.add_argument("--loadtest-s", type=float, default=30.0, help="length of the final load test")
    p.add_argument("--spike-rate", type=float, default=60.0, help="requests per second in the load test's spike")
    args = p.parse_args(argv)
    from functions.examples.digits import build_digits_onnx, digits_data

    state = Path(args.state_dir)
    shutil.rmtree(state, ignore_errors=True)
    model = state.parent / "examples" / "digits.onnx"
    if not model.exists():
        print(f"building the example model -> {model}")
        build_digits_onnx(model)
    x, y = digits_data()

    _step("1. start the control plane (gateway, API, controller, zygote, registry) on loopback")
    plane, url = _up(state)
    try:
        with Shoal(url, state_dir=state) as shoal:
            _story(shoal, model, x, y, args.burst_s)
        _step("8. restart the control plane: the registry keeps the function, scaled to zero")
        _down(plane)
        plane, url = _up(state)
        with Shoal(url, state_dir=state) as shoal:
            names = [f["name"] for f in shoal.functions()]
            started = time.perf_counter()
            r = shoal.invoke("digits", _body(x[:1]))
            print(f"   functions after restart: {names}; first request {r.status_code} in "
                  f"{(time.perf_counter() - started) * 1000:.0f} ms (cold: {r.headers.get('shoal-cold-start')})")
            # its model metadata, read from the warm replica now, so the load test below can read it
            # from the control API without waking the function at zero
            shoal.http.get("/v2/models/digits").raise_for_status()
            _events(shoal)
        _step(f"9. load test (shoal loadtest): a spike of {args.spike_rate:g} requests/s into the function at zero, open loop")
        report = state / "report"
        code = subprocess.call([sys.executable, "-m", "deploy.cli", "loadtest", "spike", "--function", "digits",
                                "--from-zero", "--base-rate", "0", "--rate", str(args.spike_rate),
                                "--duration", str(args.loadtest_s), "--url", url, "--state-dir", str(state),
                                "--out", str(report), "--title", "demo: a spike into digits at zero"])
        if code != 0:
            print(f"   shoal loadtest failed with exit code {code}", file=sys.stderr)
            return code
    finally:
        _down(plane)
    print(f"\nlogs and registry: {state}/ (registry.db, logs/)")
    print(f"load-test report:   {(report / 'report.html').resolve()}  (open it in a browser; summary.json beside it)")
    return 0


def _story(shoal: Shoal, model: Path, x: np.ndarray, y: np.ndarray, burst_s: float) -> None:
    _step("2. deploy the model: slice 1/4, min 0, max 4 replicas, to zero after 5 s idle")
    function = shoal.deploy(model, "digits", slice="1/4", max_replicas=4, idle_to_zero_s=5,
                            target_concurrency=2, batch=16, batch_delay_ms=1)
    print(f"   deployed {function['name']} revision {function['revision']}: {shoal.url}{function['endpoints']['v2']}")
    print(f"   replicas running: {_ready(shoal)}")

    _step("3. first request while the function is at zero")
    started = time.perf_counter()
    r = shoal.invoke("digits", _body(x[:4]))
    elapsed = time.perf_counter() - started
    labels = r.json()["outputs"][0]["data"]
    print(f"   {r.status_code} in {elapsed * 1000:.0f} ms, labels {labels} (true {y[:4].tolist()})")
    print(f"   cold start phases (s): {r.headers.get('shoal-cold-start')}")

    _step("4. the same function through tritonclient (binary tensors) and KServe V1")
    import tritonclient.http as triton

    client = triton.InferenceServerClient(shoal.url.removeprefix("http://"))
    tensor = triton.InferInput("X", [4, 64], "FP32")
    tensor.set_data_from_numpy(x[4:8], binary_data=True)
    result = client.infer("digits", [tensor], outputs=[triton.InferRequestedOutput("label", binary_data=True)])
    print(f"   tritonclient: labels {result.as_numpy('label').tolist()} (true {y[4:8].tolist()})")
    v1 = shoal.invoke("digits", {"instances": x[8:10].tolist()}).json()
    print(f"   KServe V1:    labels {[p['label'] for p in v1['predictions']]} (true {y[8:10].tolist()})")

    _step(f"5. a burst: 64 concurrent clients for {burst_s:.0f} s")
    done, failed, seconds = asyncio.run(_burst(shoal.url, x, burst_s))
    print(f"   {done} requests in {seconds:.1f} s ({done / seconds:.0f}/s), {failed} failed")
    print(f"   replicas running: {_ready(shoal)}")
    print("\n" + _indent(_top(shoal)))

    _step("6. idle: the function scales back to zero after idle_to_zero_s = 5")
    deadline = time.monotonic() + 30
    while _ready(shoal) > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    print(f"   replicas running: {_ready(shoal)}")
    _step("7. what the controller decided, and why (shoal events)")
    _events(shoal)


async def _burst(url: str, x: np.ndarray, seconds: float) -> tuple[int, int, float]:
    done = failed = 0
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=64)) as client:
        async def user(i: int) -> None:
            nonlocal done, failed
            while time.monotonic() < end:
                r = await client.post("/v2/models/digits/infer", json=_body(x[i % len(x):i % len(x) + 1]))
                done += 1
                failed += r.status_code != 200

        start = time.monotonic()
        end = start + seconds
        await asyncio.gather(*(user(i) for i in range(64)))
        return done, failed, time.monotonic() - start


def _body(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "X", "shape": list(x.shape), "datatype": "FP32", "data": x.reshape(-1).tolist()}],
            "outputs": [{"name": "label"}]}


def _ready(shoal: Shoal) -> int:
    return shoal.status()["functions"].get("digits", {}).get("ready", 0)


def _top(shoal: Shoal) -> str:
    from deploy.cli.commands import render_top

    return render_top(shoal.status())


def _events(shoal: Shoal) -> None:
    from datetime import datetime

    for e in shoal.events("digits"):
        stamp = datetime.fromtimestamp(e["at"]).strftime("%H:%M:%S.%f")[:-3]
        print(f"   {stamp}  {e['kind']:<15} {e['message']}")


def _up(state: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "deploy.cli", "up", "--port", "0", "--state-dir", str(state), "--tick-s", "0.5",
         "--log-level", "warning"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    banner = proc.stdout.readline().strip()
    url = banner.split("endpoint ", 1)[1].split()[0]
    while True:
        try:
            if httpx.get(f"{url}/v2/health/ready").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    print(f"   {banner}")
    return proc, url


def _down(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _step(text: str) -> None:
    print(f"\n{text}", flush=True)


def _indent(text: str) -> str:
    return "\n".join("   " + line for line in text.splitlines())


if __name__ == "__main__":
    sys.exit(main())
