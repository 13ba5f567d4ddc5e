"""`shoal demo` (`make demo`): the main job on the embedded default, start to finish.

Builds the example digits model (scikit-learn's bundled data, to ONNX), serves it
with one replica on loopback, calls it the ways a user would (V2 JSON, V2 binary
tensors through tritonclient, KServe V1), sends a concurrent burst that the
replica batches, reads its duty cycle from /metrics, and shuts it down with
SIGTERM. Later issues grow this into the platform story (scale from zero, report).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="shoal demo", description=__doc__.splitlines()[0])
    p.add_argument("--state-dir", default=".shoal", help="where the example model is written (default .shoal)")
    args = p.parse_args(argv)
    from functions.examples.digits import build_digits_onnx, digits_data

    model = Path(args.state_dir) / "examples" / "digits.onnx"
    if not model.exists():
        print(f"building the example model -> {model}")
        build_digits_onnx(model)
    x, y = digits_data()
    proc, url = _start(model)
    try:
        _story(url, x, y)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        print(f"\nSIGTERM: the replica drained and exited with status {code}")
    return 0


def _start(model: Path) -> tuple[subprocess.Popen, str]:
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "serving.replica", str(model), "--name", "digits", "--port", "0",
         "--max-batch-size", "16", "--max-queue-delay-ms", "2"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    banner = proc.stdout.readline().strip()
    url = banner.split("listening on ", 1)[1].split()[0]
    while httpx.get(f"{url}/v2/health/ready").status_code != 200:
        time.sleep(0.01)
    print(f"{banner}\nready {time.perf_counter() - started:.2f} s after start")
    return proc, url


def _story(url: str, x: np.ndarray, y: np.ndarray) -> None:
    import tritonclient.http as triton

    meta = httpx.get(f"{url}/v2/models/digits").json()
    print(f"\nmodel metadata: inputs {meta['inputs']} outputs {[o['name'] for o in meta['outputs']]}")

    body = {"inputs": [{"name": "X", "shape": [4, 64], "datatype": "FP32", "data": x[:4].tolist()}],
            "outputs": [{"name": "label"}]}
    labels = httpx.post(f"{url}/v2/models/digits/infer", json=body).json()["outputs"][0]["data"]
    print(f"V2 JSON      labels {labels}   (true {y[:4].tolist()})")

    client = triton.InferenceServerClient(url.removeprefix("http://"))
    tensor = triton.InferInput("X", [4, 64], "FP32")
    tensor.set_data_from_numpy(x[4:8], binary_data=True)
    result = client.infer("digits", [tensor], outputs=[triton.InferRequestedOutput("label", binary_data=True)])
    print(f"V2 binary    labels {result.as_numpy('label').tolist()}   (true {y[4:8].tolist()}, via tritonclient)")

    v1 = httpx.post(f"{url}/v1/models/digits:predict", json={"instances": x[8:10].tolist()}).json()
    print(f"V1 predict   labels {[p['label'] for p in v1['predictions']]}   (true {y[8:10].tolist()})")

    bad = httpx.post(f"{url}/v2/models/digits/infer", json={"inputs": [{**body["inputs"][0], "datatype": "FP64"}]})
    print(f"bad input    {bad.status_code} {bad.json()}")

    n = 400
    correct, seconds = asyncio.run(_burst(url, x[:n], y[:n]))
    metrics = _metrics(httpx.get(f"{url}/metrics").text)
    batches = metrics['shoal_replica_batch_size_count{function="digits"}']
    rows = metrics['shoal_replica_batch_size_sum{function="digits"}']
    busy = metrics['shoal_replica_busy_seconds_total{function="digits"}']
    print(f"\nburst        {n} concurrent single-row requests in {seconds:.2f} s, {correct}/{n} correct")
    print(f"batching     {rows:.0f} rows in {batches:.0f} batches (mean {rows / batches:.1f} rows per batch)")
    print(f"duty cycle   executor busy {busy:.3f} s of {seconds:.2f} s wall = {busy / seconds:.1%} of the slice")


async def _burst(url: str, x: np.ndarray, y: np.ndarray) -> tuple[int, float]:
    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        async def one(i: int) -> bool:
            body = {"inputs": [{"name": "X", "shape": [1, 64], "datatype": "FP32", "data": x[i].tolist()}],
                    "outputs": [{"name": "label"}]}
            r = await client.post(f"{url}/v2/models/digits/infer", json=body)
            return r.json()["outputs"][0]["data"][0] == int(y[i])

        start = time.perf_counter()
        results = await asyncio.gather(*(one(i) for i in range(len(x))))
        return sum(results), time.perf_counter() - start


def _metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


if __name__ == "__main__":
    sys.exit(main())
