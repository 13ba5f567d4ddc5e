"""Benchmark: what the gateway adds, and how fast a function comes back from zero.
Against a real `shoal up` on loopback (control plane on one core, load client on the other), in
one run: p50/p99 at a fixed open-loop rate through the gateway and directly to the replica, and
the time from a request sent at zero replicas to its response, with the gateway's per-phase
breakdown; with a Ray Serve venv (`make ray-venv`), the same two for Ray Serve. Talks to Shoal
only over HTTP. Method and results: docs/benchmarks.md.

    python -m loadtests.bench.gateway [--rate 200] [--seconds 5] [--rounds 3] [--colds 10] [--ray-venv .venv-ray]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from loadtests.bench.replica import BODY, CLIENT_CPUS, SERVER_CPUS, _pin, prepare_inputs, quantile_ms, report

PATH = "/v2/models/{name}/infer"


class Plane:
    def __init__(self, state: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "up", "--port", "0", "--state-dir", str(state), "--tick-s", "0.2",
             "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=_pin(SERVER_CPUS),
        )
        banner = self.proc.stdout.readline()
        self.url = banner.split("endpoint ", 1)[1].split()[0]
        self.port = int(self.url.rsplit(":", 1)[1])
        token = (state / "token").read_text().strip()
        self.http = httpx.Client(base_url=self.url, headers={"authorization": f"Bearer {token}"}, timeout=60)
        _wait(lambda: self.http.get("/v2/health/ready").status_code == 200, 60)

    def deploy(self, model: Path, name: str, **scaling) -> None:
        upload = self.http.post("/api/v1/artifacts", params={"filename": model.name}, content=model.read_bytes())
        upload.raise_for_status()
        spec = {"artifact": upload.json()["ref"], "slice": "1/2", "scaling": scaling}
        self.http.put(f"/api/v1/functions/{name}", json=spec).raise_for_status()

    def function(self, name: str) -> dict:
        return self.http.get("/api/v1/status").json()["functions"].get(name, {})

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def _wait(predicate, timeout: float, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except httpx.TransportError:
            pass
        time.sleep(interval)
    raise RuntimeError("timed out")


def open_loop(port: int, path: str, body_file: Path, rate: float, seconds: float, strict: bool = True) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "loadtests.bench.httpload", "--port", str(port), "--path", path,
         "--body-file", str(body_file), "--rate", str(rate), "--seconds", str(seconds)],
        capture_output=True, text=True, preexec_fn=_pin(CLIENT_CPUS), check=True, timeout=seconds + 60,
    )
    result = json.loads(out.stdout)
    if strict and (set(result["statuses"]) != {"200"} or result["errors"]):
        raise RuntimeError(f"failures: {result['statuses']}, errors {result['errors']}")
    return result


def _at_zero_for(ready, seconds: float, timeout: float = 120) -> None:
    """Wait until `ready()` has read 0 continuously for `seconds` (a status that
    flickers while replicas stop must not start the clock early)."""
    deadline = time.monotonic() + timeout
    since = None
    while time.monotonic() < deadline:
        if ready() == 0:
            since = since or time.monotonic()
            if time.monotonic() - since >= seconds:
                return
        else:
            since = None
        time.sleep(0.05)
    raise RuntimeError("the function did not stay at zero replicas")


def cold_starts(url: str, path: str, ready, count: int) -> tuple[list[float], list[str]]:
    """Wait until no replica runs, then time one request; `count` times."""
    times, phases = [], []
    with httpx.Client(timeout=60) as client:
        for _ in range(count):
            _at_zero_for(ready, 1.0)
            start = time.perf_counter()
            r = client.post(url + path, content=BODY, headers={"content-type": "application/json"})
            times.append(time.perf_counter() - start)
            if r.status_code != 200:
                raise RuntimeError(f"cold request failed: {r.status_code} {r.text}")
            phases.append(r.headers.get("shoal-cold-start", ""))
    return times, phases


def run_shoal(model: Path, body_file: Path, rates: list[float], seconds: float, rounds: int, colds: int) -> dict:
    state = Path(tempfile.mkdtemp(prefix="shoal-bench-gw-")) / "state"
    plane = Plane(state)
    try:
        plane.deploy(model, "digits", min_replicas=1, max_replicas=1)
        plane.deploy(model, "cold", min_replicas=0, max_replicas=1, idle_to_zero_s=0.5)
        _wait(lambda: plane.function("digits").get("ready") == 1, 60)
        replica_port = plane.function("digits")["replicas"][0]["port"]
        path = PATH.format(name="digits")
        open_loop(plane.port, path, body_file, rates[0], 2)  # warm both paths
        open_loop(replica_port, path, body_file, rates[0], 2)
        by_rate = {}
        for rate in rates:
            direct, gateway = [], []
            for r in range(rounds):
                d = open_loop(replica_port, path, body_file, rate, seconds)["latencies_s"]
                g = open_loop(plane.port, path, body_file, rate, seconds)["latencies_s"]
                direct += d
                gateway += g
                print(f"  {rate:g}/s round {r + 1}/{rounds}: direct p50 {quantile_ms(d, .5):.3f} ms, "
                      f"gateway p50 {quantile_ms(g, .5):.3f} ms", flush=True)
            by_rate[rate] = (direct, gateway)
        # the live replica list (not the last tick's snapshot) says when the function is at zero
        times, phases = cold_starts(plane.url, PATH.format(name="cold"),
                                    lambda: len(plane.function("cold").get("replicas", [])), colds)
        print(f"  scale from zero: {', '.join(f'{t * 1000:.0f}' for t in times)} ms", flush=True)
    finally:
        plane.stop()
        shutil.rmtree(state.parent, ignore_errors=True)
    return {"by_rate": by_rate, "cold_s": times, "cold_phases": phases}


def run_ray(venv: Path, model: Path, body_file: Path, rate: float, seconds: float, rounds: int, colds: int) -> dict | None:
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"  Ray Serve: not measured ({python} missing; make ray-venv)")
        return None
    proc = subprocess.Popen(
        [str(python), str(Path(__file__).resolve().parents[1] / "peers" / "ray_serve_app.py"), str(model)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=_pin(SERVER_CPUS),
        start_new_session=True,
    )
    try:
        banner = proc.stdout.readline()
        if "ray serve ready" not in banner:
            print(f"  Ray Serve: did not start ({banner.strip()})")
            return None
        port = int(banner.split()[-1])
        url = f"http://127.0.0.1:{port}"
        path = "/digits"
        status = Path(banner.split()[-2])

        def ready() -> int:
            return int(status.read_text() or 0) if status.exists() else 0

        _wait(lambda: httpx.post(url + path, content=BODY, timeout=60).status_code == 200, 120)
        open_loop(port, path, body_file, rate, 2, strict=False)
        hot, failed = [], 0
        for _ in range(rounds):
            result = open_loop(port, path, body_file, rate, seconds, strict=False)
            hot += result["latencies_s"]
            failed += result["errors"] + sum(v for k, v in result["statuses"].items() if k != "200")
        times, _ = cold_starts(url, path, ready, colds)
        print(f"  Ray Serve: p50 {quantile_ms(hot, .5):.3f} ms, scale from zero "
              f"{', '.join(f'{t * 1000:.0f}' for t in times)} ms", flush=True)
        return {"hot": hot, "failed": failed, "cold_s": times}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        # Ray's own daemons (GCS, raylet) outlive the driver unless told to stop
        subprocess.run([str(venv / "bin" / "ray"), "stop", "--force"], capture_output=True, timeout=60)


def summarize(shoal: dict, ray: dict | None, ray_rate: float) -> dict:
    rates = {}
    for rate, (direct, gateway) in shoal["by_rate"].items():
        rates[rate] = {
            "direct_p50_ms": quantile_ms(direct, .5), "direct_p99_ms": quantile_ms(direct, .99),
            "gateway_p50_ms": quantile_ms(gateway, .5), "gateway_p99_ms": quantile_ms(gateway, .99),
        }
        rates[rate]["added_p50_ms"] = rates[rate]["gateway_p50_ms"] - rates[rate]["direct_p50_ms"]
    out = {
        "rates": rates, "ray_rate_rps": ray_rate,
        "cold_p50_s": statistics.median(shoal["cold_s"]), "cold_max_s": max(shoal["cold_s"]),
        "cold_samples": len(shoal["cold_s"]),
        "cold_phases_of_median": shoal["cold_phases"][_median_index(shoal["cold_s"])],
    }
    if ray:
        out["ray_p50_ms"] = quantile_ms(ray["hot"], .5)
        out["ray_p99_ms"] = quantile_ms(ray["hot"], .99)
        out["ray_cold_p50_s"] = statistics.median(ray["cold_s"])
        out["ray_failed"] = ray["failed"]
    out["targets"] = {f"gateway adds <= 0.5 ms at p50 at {rate:g}/s": r["added_p50_ms"] <= 0.5 for rate, r in rates.items()}
    out["targets"]["scale from zero p50 <= 0.3 s"] = out["cold_p50_s"] <= 0.3
    return out


def _median_index(values: list[float]) -> int:
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[len(order) // 2]


def render(s: dict) -> str:
    lines = ["open loop, digits ONNX model, V2 JSON, one row per request", "",
             "| rate (req/s) | path | p50 (ms) | p99 (ms) | added at p50 (ms) |", "|---|---|---|---|---|"]
    for rate, r in s["rates"].items():
        lines.append(f"| {rate:g} | directly to the replica | {r['direct_p50_ms']:.3f} | {r['direct_p99_ms']:.3f} | |")
        lines.append(f"| {rate:g} | through Shoal's gateway | {r['gateway_p50_ms']:.3f} | {r['gateway_p99_ms']:.3f} "
                     f"| {r['added_p50_ms']:.3f} |")
    if "ray_p50_ms" in s:
        failed = f" ({s['ray_failed']} failed or timed out)" if s["ray_failed"] else ""
        lines.append(f"| {s['ray_rate_rps']:g} | Ray Serve, through its proxy{failed} | {s['ray_p50_ms']:.3f} "
                     f"| {s['ray_p99_ms']:.3f} | |")
    lines += ["",
              f"scale from zero to first response: p50 {s['cold_p50_s'] * 1000:.0f} ms, max {s['cold_max_s'] * 1000:.0f} ms "
              f"over {s['cold_samples']} (phases of the median one, s: {s['cold_phases_of_median']})"]
    if "ray_cold_p50_s" in s:
        lines.append(f"Ray Serve scale from zero to first response: p50 {s['ray_cold_p50_s'] * 1000:.0f} ms")
    lines.append("")
    lines += [f"- target {'met' if ok else 'MISSED'}: {name}" for name, ok in s["targets"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="50,200", help="open-loop rates to measure Shoal at (req/s)")
    p.add_argument("--ray-rate", type=float, default=50.0,
                   help="open-loop rate for Ray Serve (its capacity here is about 100/s)")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--colds", type=int, default=10)
    p.add_argument("--ray-venv", default=".venv-ray", help="a venv with ray[serve]; skipped when missing")
    p.add_argument("--json")
    args = p.parse_args(argv)
    model, body_file = prepare_inputs()
    print(f"control plane CPUs {SERVER_CPUS}, client CPUs {CLIENT_CPUS}", flush=True)
    rates = [float(r) for r in args.rates.split(",")]
    shoal = run_shoal(model, body_file, rates, args.seconds, args.rounds, args.colds)
    ray = run_ray(Path(args.ray_venv), model, body_file, args.ray_rate, args.seconds, args.rounds, args.colds)
    summary = summarize(shoal, ray, args.ray_rate)
    report(render(summary), summary, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
