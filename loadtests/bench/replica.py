"""Benchmark: the same ONNX model behind Shoal's replica and behind KServe's ModelServer.
In one run, over HTTP on loopback, server and load client on cores of their own, phases
alternating over rounds so a shared machine's drift hits both alike: p50/p99 latency at low
load, throughput at saturation, start-to-ready and RSS after the load; it prints the ratios and
the issue's targets. Method and results: docs/benchmarks.md.

    python -m loadtests.bench.replica [--rounds 3] [--seconds 4] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import psutil

REQUEST_ROW = [float(v) for v in (np.arange(64) % 17)]
BODY = json.dumps({"inputs": [{"name": "X", "shape": [1, 64], "datatype": "FP32", "data": REQUEST_ROW}]}).encode()
PATH = "/v2/models/digits/infer"


def _cpus() -> tuple[set[int] | None, set[int] | None]:
    """Server on one core, load client on another (when there are two)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < 2:
        return None, None
    return {cores[-1]}, {cores[0]}


SERVER_CPUS, CLIENT_CPUS = _cpus()


def _pin(cpus):
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(kind: str, model: Path, port: int) -> list[str]:
    if kind == "shoal":
        # batching is opt-in; this is the configuration measured (KServe's server has no batching)
        return [sys.executable, "-m", "serving.replica", str(model), "--name", "digits", "--port", str(port),
                "--max-batch-size", "32", "--log-level", "error"]
    return [sys.executable, "-m", "loadtests.peers.kserve_onnx", str(model), "--name", "digits",
            "--http_port", str(port)]


def start(kind: str, model: Path) -> tuple[subprocess.Popen, int, float]:
    """Start a server; returns the process, its port and the seconds until ready."""
    port = _free_port()
    began = time.perf_counter()
    proc = subprocess.Popen(
        server_command(kind, model, port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=_pin(SERVER_CPUS),
    )
    url = f"http://127.0.0.1:{port}/v2/health/ready"
    with httpx.Client(timeout=1) as client:
        while time.perf_counter() - began < 60:
            if proc.poll() is not None:
                raise RuntimeError(f"{kind} exited with {proc.returncode} before ready")
            try:
                if client.get(url).status_code == 200:
                    return proc, port, time.perf_counter() - began
            except httpx.TransportError:
                pass
            time.sleep(0.002)
    proc.kill()
    raise RuntimeError(f"{kind} not ready in 60 s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def load(port: int, body_file: Path, connections: int, seconds: float, requests: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "loadtests.bench.httpload", "--port", str(port), "--path", PATH,
         "--body-file", str(body_file), "--connections", str(connections), "--seconds", str(seconds),
         "--requests", str(requests)],
        capture_output=True, text=True, preexec_fn=_pin(CLIENT_CPUS), check=True, timeout=seconds + 120,
    )
    result = json.loads(out.stdout)
    bad = {k: v for k, v in result["statuses"].items() if k != "200"}
    if bad or result["errors"]:
        raise RuntimeError(f"load saw failures: statuses {result['statuses']}, connection errors {result['errors']}")
    return result


def mean_batch_rows(port: int) -> float:
    """Rows per executed batch over the whole run, from the replica's own /metrics."""
    values = {}
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines():
        if line.startswith("shoal_replica_batch_size_"):
            key, _, value = line.rpartition(" ")
            values[key.split("{")[0]] = float(value)
    return values["shoal_replica_batch_size_sum"] / values["shoal_replica_batch_size_count"]


def quantile_ms(latencies: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(latencies), q) * 1000.0)


def prepare_inputs() -> tuple[Path, Path]:
    """The digits ONNX model and the request body, in a fresh temporary folder."""
    work = Path(tempfile.mkdtemp(prefix="shoal-bench-"))
    model = work / "digits.onnx"
    subprocess.run([sys.executable, "-m", "functions.examples.digits", str(model)], check=True, capture_output=True)
    body_file = work / "body.json"
    body_file.write_bytes(BODY)
    return model, body_file


def report(text: str, summary: dict, json_path: str | None) -> None:
    print()
    print(text)
    if json_path:
        Path(json_path).write_text(json.dumps(summary, indent=2))


def run(rounds: int, seconds: float, low_requests: int, starts: int) -> dict:
    model, body_file = prepare_inputs()
    kinds = ["shoal", "kserve"]
    results: dict[str, dict] = {k: {"ready_s": [], "low": [], "sat_rps": [], "sat": []} for k in kinds}

    for i in range(starts):  # start-to-ready, alternating
        for kind in kinds:
            proc, _, ready = start(kind, model)
            results[kind]["ready_s"].append(ready)
            stop(proc)
            print(f"  start {i + 1}/{starts} {kind}: ready in {ready:.3f} s", flush=True)

    servers = {kind: start(kind, model) for kind in kinds}
    try:
        for kind in kinds:  # warm-up
            load(servers[kind][1], body_file, 1, 30, 300)
        for r in range(rounds):
            for kind in kinds:
                low = load(servers[kind][1], body_file, 1, 60, low_requests)
                results[kind]["low"].extend(low["latencies_s"])
                sat = load(servers[kind][1], body_file, 32, seconds, 10**9)
                rps = len(sat["latencies_s"]) / sat["seconds"]
                results[kind]["sat_rps"].append(rps)
                results[kind]["sat"].extend(sat["latencies_s"])
                print(f"  round {r + 1}/{rounds} {kind}: low-load p50 "
                      f"{quantile_ms(low['latencies_s'], 0.5):.3f} ms, saturation {rps:.0f} req/s", flush=True)
        for kind in kinds:
            results[kind]["rss_mib"] = psutil.Process(servers[kind][0].pid).memory_info().rss / 2**20
        results["shoal"]["mean_batch_rows"] = mean_batch_rows(servers["shoal"][1])
    finally:
        for proc, _, _ in servers.values():
            stop(proc)
    return summarize(results)


def summarize(raw: dict[str, dict]) -> dict:
    summary = {}
    for kind, r in raw.items():
        summary[kind] = {
            "p50_ms": quantile_ms(r["low"], 0.5),
            "p99_ms": quantile_ms(r["low"], 0.99),
            "saturation_rps": statistics.median(r["sat_rps"]),
            "saturation_p50_ms": quantile_ms(r["sat"], 0.5),
            "saturation_p99_ms": quantile_ms(r["sat"], 0.99),
            "start_to_ready_s": statistics.median(r["ready_s"]),
            "rss_mib": r["rss_mib"],
            "low_load_requests": len(r["low"]),
        }
        if "mean_batch_rows" in r:
            summary[kind]["mean_batch_rows"] = r["mean_batch_rows"]
    s, k = summary["shoal"], summary["kserve"]
    summary["ratios"] = {
        "p50_shoal_over_kserve": s["p50_ms"] / k["p50_ms"],
        "p99_shoal_over_kserve": s["p99_ms"] / k["p99_ms"],
        "throughput_shoal_over_kserve": s["saturation_rps"] / k["saturation_rps"],
        "start_shoal_over_kserve": s["start_to_ready_s"] / k["start_to_ready_s"],
        "rss_shoal_over_kserve": s["rss_mib"] / k["rss_mib"],
    }
    summary["targets"] = {
        "p50 no worse than KServe": s["p50_ms"] <= k["p50_ms"],
        "saturation throughput >= 1.5x KServe": summary["ratios"]["throughput_shoal_over_kserve"] >= 1.5,
        "start-to-ready <= 0.3 s": s["start_to_ready_s"] <= 0.3,
        "RSS well under KServe's": s["rss_mib"] <= 0.5 * k["rss_mib"],
    }
    return summary


def render(summary: dict) -> str:
    s, k, r = summary["shoal"], summary["kserve"], summary["ratios"]
    rows = [
        ("p50 latency, low load (ms)", s["p50_ms"], k["p50_ms"], r["p50_shoal_over_kserve"], ".3f"),
        ("p99 latency, low load (ms)", s["p99_ms"], k["p99_ms"], r["p99_shoal_over_kserve"], ".3f"),
        ("throughput at saturation (req/s)", s["saturation_rps"], k["saturation_rps"], r["throughput_shoal_over_kserve"], ".0f"),
        ("p50 at saturation (ms)", s["saturation_p50_ms"], k["saturation_p50_ms"], s["saturation_p50_ms"] / k["saturation_p50_ms"], ".2f"),
        ("p99 at saturation (ms)", s["saturation_p99_ms"], k["saturation_p99_ms"], s["saturation_p99_ms"] / k["saturation_p99_ms"], ".2f"),
        ("start to ready (s)", s["start_to_ready_s"], k["start_to_ready_s"], r["start_shoal_over_kserve"], ".3f"),
        ("RSS after load (MiB)", s["rss_mib"], k["rss_mib"], r["rss_shoal_over_kserve"], ".0f"),
    ]
    lines = ["| measure | Shoal replica | KServe ModelServer | Shoal / KServe |", "|---|---|---|---|"]
    lines += [f"| {name} | {a:{fmt}} | {b:{fmt}} | {ratio:.2f}x |" for name, a, b, ratio, fmt in rows]
    lines.append("")
    lines.append(f"Shoal's replica ran {s['mean_batch_rows']:.2f} rows per batch over the run (its /metrics).")
    lines.append("")
    lines += [f"- target {'met' if ok else 'MISSED'}: {name}" for name, ok in summary["targets"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=4.0, help="seconds per saturation phase")
    p.add_argument("--low-requests", type=int, default=1000, help="sequential requests per low-load phase")
    p.add_argument("--starts", type=int, default=5, help="start-to-ready samples per server")
    p.add_argument("--json", help="write the summary here")
    args = p.parse_args(argv)
    print(f"server CPUs {SERVER_CPUS}, client CPUs {CLIENT_CPUS}, {os.cpu_count()} cores", flush=True)
    summary = run(args.rounds, args.seconds, args.low_requests, args.starts)
    report(render(summary), summary, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
