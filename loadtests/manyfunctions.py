"""Many small functions on emulated devices: deploy N functions of one emulated profile at a small
slice on a `shoal up` (its own, started here with `--devices emulated:...`, or a running one), drive
them with `shoal loadtest longtail` (open loop, Zipf-skewed popularity, every request's outcome and
latency from its send logged by Locust), and print requests, answered, refused (503) and why, SLO
attainment, cold starts, the slices taken back from other functions' replicas and the first replicas that
time-shared a device. It talks to Shoal over HTTP
only; the devices are emulated and every figure it prints says so. Run and results: docs/loadtests.md.

    python -m loadtests.manyfunctions --functions 24 --slice 1/8 --devices emulated:1x80GiB \\
        --rate 30 --duration 60 --out loadtests/reports/many-24
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from loadtests import analysis, runner

INPUTS = [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 8, 8]}]
OUTPUTS = [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]


@dataclass(frozen=True)
class Fleet:
    """The functions to deploy: `count` of one emulated profile at `slice`."""

    count: int = 24
    slice: str = "1/8"
    latency_ms: float = 20.0  # service time at batch 1 (slept by the emulated device)
    load_s: float = 1.0  # model load: part of each cold start
    memory_mib: int = 1024
    slo_ms: float = 500.0
    idle_to_zero_s: float = 60.0  # keep-alive: longer than a quiet function's gaps, so idle replicas hold slices

    def names(self) -> list[str]:
        width = len(str(self.count - 1))
        return [f"f{i:0{width}d}" for i in range(self.count)]

    def profile(self) -> str:
        return (f"kind: profile\ninputs:\n  - {{name: image, datatype: FP32, shape: [-1, 3, 8, 8]}}\n"
                f"outputs:\n  - {{name: logits, datatype: FP32, shape: [-1, 10]}}\n"
                f"latency_ms: {{1: {self.latency_ms}}}\nmemory_mib: {self.memory_mib}\nload_s: {self.load_s}\n")


def deploy(url: str, token: str | None, fleet: Fleet) -> list[str]:
    """Upload the profile once and register every function (none started: they scale from zero)."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=url, headers=headers, timeout=60.0) as http:
        r = http.post("/api/v1/artifacts", params={"filename": "emulated-small.yaml"}, content=fleet.profile().encode())
        _ok(r, "upload the profile")
        ref = r.json()["ref"]
        for name in fleet.names():
            spec = {"artifact": ref, "slice": fleet.slice, "loader": "profile",
                    "scaling": {"min_replicas": 0, "max_replicas": 8, "slo_p95_ms": fleet.slo_ms,
                                "idle_to_zero_s": fleet.idle_to_zero_s}}
            _ok(http.put(f"/api/v1/functions/{name}", json=spec), f"deploy {name}")
    return fleet.names()


def _ok(r: httpx.Response, what: str) -> None:
    if r.status_code >= 400:
        raise runner.LoadTestError(f"{what}: {r.status_code} {r.text[:300]}")


def inputs_file(names: list[str], path: Path) -> Path:
    """The V2 metadata of every function, so that the load test asks none (a metadata request
    through the gateway would start a replica of each before the load)."""
    path.write_text(json.dumps({n: {"name": n, "inputs": INPUTS, "outputs": OUTPUTS} for n in names}))
    return path


def loadtest_args(names: list[str], url: str, state_dir: Path, out: Path, *, rate: float, duration_s: float,
                  zipf: float, seed: int, drain_s: float) -> list[str]:
    return ["longtail", "--function", ",".join(names), "--rate", str(rate), "--duration", str(duration_s),
            "--zipf", str(zipf), "--seed", str(seed), "--url", url, "--state-dir", str(state_dir),
            "--inputs", str(inputs_file(names, out.parent / f"{out.name}-inputs.json")), "--out", str(out),
            "--drain-s", str(drain_s), "--quiet", "--title", f"{len(names)} small functions (emulated devices)"]


def outcome(out: Path) -> dict[str, Any]:
    """What the run's folder says: requests, answered, refused and why, SLO, cold starts, take-backs."""
    summary = json.loads((out / "summary.json").read_text())
    req = analysis.read_requests(out / "requests.csv", summary["started_at"])
    events = json.loads((out / "events.json").read_text())
    names = set(summary["functions"])
    refused = req.status == 503
    why: dict[str, int] = {}
    for e in req.error[refused].tolist():
        key = re.sub(r"\d+(\.\d+)?", "N", re.sub(r"\bf\d+\b", "F", e or "(no reason given)"))[:120]
        why[key] = why.get(key, 0) + 1
    takebacks = [e for e in events if e["kind"] == "takeback" and e.get("function") in names]
    shared = [e for e in events if e["kind"] == "time_share" and e.get("function") in names]
    unplaceable = [e for e in events if e["kind"] == "unplaceable" and e.get("function") in names]
    return {
        "requests": len(req), "answered": int(np.count_nonzero(req.ok)), "refused_503": int(np.count_nonzero(refused)),
        "refused_why": dict(sorted(why.items(), key=lambda kv: -kv[1])),
        "other_failures": summary["failures"] - int(np.count_nonzero(refused)),
        "failures_by_status": summary["errors_by_status"],
        "slo_attainment": summary["slo_attainment"], "p95_ms": summary["latency_ms"]["p95"],
        "cold_starts": summary["cold_starts"]["count"], "takebacks": len(takebacks),
        "takebacks_by_pair": _pairs(takebacks), "time_shared": len(shared),
        "time_shared_by_device": dict(sorted(Counter(e["data"]["device"] for e in shared).items())),
        "unplaceable_events": len(unplaceable),
        "unplaceable_refused": sum(1 for e in unplaceable if not (e.get("data") or {}).get("waiting")),
        "replica_slice_seconds": summary["replica_slice_seconds"],
    }


def _pairs(takebacks: list[dict[str, Any]]) -> dict[str, int]:
    pairs: dict[str, int] = {}
    for e in takebacks:
        key = f"{e['function']} <- {(e.get('data') or {}).get('from')}"
        pairs[key] = pairs.get(key, 0) + 1
    return dict(sorted(pairs.items(), key=lambda kv: -kv[1])[:5])


def print_outcome(o: dict[str, Any], fleet: Fleet, devices: str, rate: float, duration_s: float) -> None:
    slices = _slices(devices, fleet.slice)
    slo = "-" if o["slo_attainment"] is None else f"{o['slo_attainment'] * 100:.2f} %"
    print(f"\n{fleet.count} functions at slice {fleet.slice} on {devices} (emulated devices: {slices} slices), "
          f"Zipf popularity, {rate:g} requests/s for {duration_s:g} s")
    print(f"requests {o['requests']}  answered {o['answered']}  refused (503) {o['refused_503']}  "
          f"other failures {o['other_failures']} {o['failures_by_status'] if o['other_failures'] else ''}".rstrip())
    for reason, n in list(o["refused_why"].items())[:3]:
        print(f"  503 x {n}: {reason}")
    print(f"SLO ({fleet.slo_ms:g} ms from send) attainment {slo}; p95 {o['p95_ms']:.1f} ms (emulated)"
          if o["p95_ms"] is not None else f"SLO attainment {slo}")
    print(f"cold starts {o['cold_starts']}  take-backs {o['takebacks']}  time-shared first replicas "
          f"{o['time_shared']}  'cannot place' events {o['unplaceable_events']} ({o['unplaceable_refused']} "
          f"refused its requests)")
    if o["time_shared"]:
        print("  time-shared, by device: " + ", ".join(f"{k} x {v}" for k, v in o["time_shared_by_device"].items()))
    if o["takebacks_by_pair"]:
        print("  most frequent take-backs (taker <- giver): "
              + ", ".join(f"{k} x {v}" for k, v in o["takebacks_by_pair"].items()))


def _slices(devices: str, slice_text: str) -> str:
    m = re.fullmatch(r"emulated:(\d+)x.*", devices)
    return str(int(int(m[1]) / Fraction(slice_text.partition(":")[0]))) if m else "?"


# ---------------------------------------------------------------------- its own shoal up


def start_up(state_dir: Path, devices: str, take_back: bool, tick_s: float,
             extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """`shoal up` on a free loopback port with `devices` (and `extra` options, e.g. `--policy kpa`),
    as a process of its own; (process, URL)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "deploy.cli", "up", "--port", "0", "--state-dir", str(state_dir),
           "--devices", devices, "--tick-s", str(tick_s), "--log-level", "warning"]
    cmd += ([] if take_back else ["--no-take-back"]) + list(extra)
    # stdout to a file, read for the banner: a pipe nobody reads after it would block shoal up once full
    out_path = state_dir / "up.out"
    with open(out_path, "w") as out, open(state_dir / "up.err", "a") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, cwd=Path(__file__).resolve().parents[1],
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    banner = ""
    while "endpoint " not in banner and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
        banner = out_path.read_text()
    if "endpoint " not in banner:
        proc.kill()
        raise runner.LoadTestError(f"shoal up did not start: {banner}{(state_dir / 'up.err').read_text()[-2000:]}")
    url = banner.split("endpoint ", 1)[1].split()[0]
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise runner.LoadTestError("shoal up was not ready within 60 s")


def stop_up(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def run(url: str, state_dir: Path, out: Path, fleet: Fleet, *, rate: float, duration_s: float, zipf: float = 1.1,
        seed: int = 0, drain_s: float = 30.0) -> dict[str, Any]:
    """Deploy the fleet on the `shoal up` at `url`, run the load, and return `outcome()`."""
    token = runner._read_token(str(state_dir))
    names = deploy(url, token, fleet)
    argv = loadtest_args(names, url, state_dir, out, rate=rate, duration_s=duration_s, zipf=zipf, seed=seed,
                         drain_s=drain_s)
    code = runner.main(argv)
    if not (out / "summary.json").exists():
        raise runner.LoadTestError(f"shoal loadtest {' '.join(argv[:2])} ... wrote no summary (exit {code})")
    return outcome(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtests.manyfunctions", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--functions", type=int, default=24, help="how many functions (default 24)")
    p.add_argument("--slice", default="1/8", help="each function's slice: 1/8, or 1/8:1024 with its memory in MiB "
                   "(default 1/8: its share of the device's memory)")
    p.add_argument("--devices", default="emulated:1x80GiB", help="shoal up --devices (default emulated:1x80GiB)")
    p.add_argument("--rate", type=float, default=30.0, help="requests per second in all (default 30)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the popularity (default 1.1)")
    p.add_argument("--latency-ms", type=float, default=20.0, help="emulated service time (default 20 ms)")
    p.add_argument("--load-s", type=float, default=1.0, help="emulated model load (default 1 s)")
    p.add_argument("--slo-ms", type=float, default=500.0, help="each function's SLO (default 500 ms)")
    p.add_argument("--idle-to-zero-s", type=float, default=60.0, help="each function's keep-alive (default 60 s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--url", help="a running shoal up (its --devices must be emulated); default: start one here")
    p.add_argument("--state-dir", help="with --url: its state dir (for the token)")
    p.add_argument("--no-take-back", action="store_true", help="start shoal up with --no-take-back (to compare)")
    p.add_argument("--time-share-busy", type=float, help="shoal up --time-share-busy of the shoal up started here "
                   "(0: no time-sharing, to compare; default: shoal up's)")
    p.add_argument("--tick-s", type=float, default=1.0, help="the controller tick of the shoal up started here")
    p.add_argument("--out", help="report folder (default loadtests/reports/many-N-TIME)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.functions < 1 or not (math.isfinite(args.rate) and args.rate > 0):
        print(f"--functions ({args.functions}) must be >= 1 and --rate ({args.rate}) > 0", file=sys.stderr)
        return 2
    if not args.devices.startswith("emulated:"):
        print(f"--devices {args.devices!r}: this load test runs on emulated devices (emulated:NxMEM)", file=sys.stderr)
        return 2
    fleet = Fleet(args.functions, args.slice, args.latency_ms, args.load_s, slo_ms=args.slo_ms,
                  idle_to_zero_s=args.idle_to_zero_s)
    out = Path(args.out or f"loadtests/reports/many-{args.functions}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = None
    try:
        if args.url:
            url, state_dir = args.url, Path(args.state_dir or ".shoal")
        else:
            state_dir = out.parent / f"{out.name}-state"
            extra = () if args.time_share_busy is None else ("--time-share-busy", str(args.time_share_busy))
            proc, url = start_up(state_dir, args.devices, not args.no_take_back, args.tick_s, extra)
        o = run(url, state_dir, out, fleet, rate=args.rate, duration_s=args.duration, zipf=args.zipf, seed=args.seed)
    except (runner.LoadTestError, ValueError) as exc:
        print(f"manyfunctions: {exc}", file=sys.stderr)
        return 2
    finally:
        if proc is not None:
            stop_up(proc)
    print_outcome(o, fleet, args.devices, args.rate, args.duration)
    (out / "many.json").write_text(json.dumps(o, indent=1))
    print(f"report: {out / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
