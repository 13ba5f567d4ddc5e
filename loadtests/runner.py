"""`shoal loadtest SCENARIO --function N`: a Locust run against Shoal, the control plane watched beside it, a report.
It runs Locust in its own process, samples the control plane's status every second, then
writes the report from the request log, the samples and the control plane's events and
counters; it talks to Shoal only over HTTP. How a run goes: docs/loadtests.md.

    shoal loadtest spike --function digits --rate 40 --duration 60 --out reports/spike
    shoal loadtest spike --function digits --out reports/b --compare reports/spike
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import httpx
import numpy as np

from loadtests import analysis
from loadtests.scenarios import SCENARIOS, make_schedule
from loadtests.tensors import ENCODINGS

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
DEFAULT_URL = "http://127.0.0.1:8080"


class ControlPlane:
    """The few calls a load test makes: over HTTP, with the bearer token."""

    def __init__(self, url: str, token: str | None, timeout_s: float = 30.0):
        self.url = url.rstrip("/")
        self.token = token
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def _get(self, path: str, **params: Any) -> Any:
        r = self.http.get(path, params=params or None)
        if r.status_code != 200:
            try:
                message = r.json().get("error", r.text)
            except ValueError:
                message = r.text
            raise LoadTestError(f"GET {path}: {r.status_code} {message}")
        return r.json() if "json" in r.headers.get("content-type", "") else r.text

    def function(self, name: str) -> dict[str, Any]:
        return self._get(f"/api/v1/functions/{name}")

    def metadata(self, name: str) -> dict[str, Any]:
        """Model metadata from the control API, off the data path: never a cold start."""
        return self._get(f"/api/v1/functions/{name}/metadata")

    def status(self) -> dict[str, Any]:
        return self._get("/api/v1/status")

    def metrics(self) -> str:
        return self._get("/metrics")

    def last_event_id(self) -> int:
        events = self._get("/api/v1/events", limit=1)["events"]
        return events[-1]["id"] if events else 0

    def events_after(self, after: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            page = self._get("/api/v1/events", after=after, limit=1000)["events"]
            out += page
            if len(page) < 1000:
                return out
            after = page[-1]["id"]


class LoadTestError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shoal loadtest", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=SCENARIOS)
    p.add_argument("--function", required=True, help="function name; longtail and csv take several, comma-separated")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    p.add_argument("--rate", type=float, default=20.0, help="peak offered requests per second (default 20)")
    p.add_argument("--users", type=int, default=0, help="closed loop with at most U users (default: open loop)")
    p.add_argument("--out", help="report folder (default loadtests/reports/SCENARIO-TIME)")
    p.add_argument("--compare", help="a previous run's folder, shown side by side")
    p.add_argument("--title", help="the report's title")
    p.add_argument("--url", help=f"Shoal's endpoint (default SHOAL_URL or {DEFAULT_URL})")
    p.add_argument("--token", help="control API token (default SHOAL_TOKEN or STATE_DIR/token)")
    p.add_argument("--state-dir", help="where shoal up keeps its token (default SHOAL_STATE_DIR or .shoal)")
    p.add_argument("--peer", help="then the same schedule against kserve and/or ray (comma-separated), "
                                  "started on loopback; the report sets the first beside Shoal")
    p.add_argument("--model", help="--peer: the ONNX file the peers serve (the function's own artifact)")
    p.add_argument("--target", help="send the load to this V2 server instead (a peer); nothing else is sampled")
    p.add_argument("--target-name", default="peer", help="what to call --target in the report")
    p.add_argument("--inputs", help="JSON {function: V2 model metadata} to build requests from, instead of asking")
    p.add_argument("--slo-ms", type=float, help="latency SLO per request (default: each function's slo_p95_ms)")
    p.add_argument("--encoding", choices=ENCODINGS, default="json", help="JSON or binary tensors")
    p.add_argument("--batch", type=int, default=1, help="rows per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--from-zero", action="store_true", help="wait until the function has no replica first")
    p.add_argument("--max-inflight", type=int, default=1000, help="open loop: most requests outstanding at once")
    p.add_argument("--drain-s", type=float, default=30.0, help="wait this long for answers after the last arrival")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    g = p.add_argument_group("scenario options")
    g.add_argument("--base-rate", type=float, help="spike: the rate outside the spike (0: into a function at zero)")
    g.add_argument("--spike-at", type=float, help="spike: when it starts (s)")
    g.add_argument("--spike-s", type=float, help="spike: how long it lasts (s)")
    g.add_argument("--step-x", type=float, help="step: the factor of the step")
    g.add_argument("--swing", type=float, help="diurnal: peak over trough")
    g.add_argument("--cv", type=float, help="gamma: coefficient of variation of the gaps")
    g.add_argument("--burst-s", type=float, help="zero-cycle: length of each burst (s)")
    g.add_argument("--idle-s", type=float, help="zero-cycle: the idle gap (s); set it past the function's "
                   "keep-alive: idle_to_zero_s, or longer where a cold start misses the SLO (docs/design/policy.md)")
    g.add_argument("--zipf", type=float, help="longtail: Zipf exponent of the popularity")
    g.add_argument("--trace", help="csv: the file to replay")
    return p


SCENARIO_OPTIONS = {"base_rate": "base_rate", "spike_at": "spike_at_s", "spike_s": "spike_s", "step_x": "step_x",
                    "swing": "swing", "cv": "cv", "burst_s": "burst_s", "idle_s": "idle_s", "zipf": "zipf_s",
                    "trace": "path"}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = _check_args(args)
    if problem:
        parser.error(problem)
    out = Path(args.out or f"loadtests/reports/{args.scenario}-{datetime.now():%Y%m%d-%H%M%S}").resolve()
    try:
        summary = run(args, out)
    except (LoadTestError, ValueError) as exc:
        print(f"shoal loadtest: {exc}", file=sys.stderr)
        return 2
    except httpx.TransportError as exc:
        print(f"shoal loadtest: cannot reach {args.url or os.environ.get('SHOAL_URL') or DEFAULT_URL}: {exc}",
              file=sys.stderr)
        return 2
    _print_headline(summary)
    print(f"report: {out / 'report.html'}")
    return 0 if summary["requests"] else 1


@dataclass
class Target:
    """Where the load goes and what is watched beside it."""

    url: str
    label: str  # "shoal", or the peer's name in the report
    plane: ControlPlane | None = None  # Shoal's control API: specs, status, events, counters
    sample: Callable[[], dict[str, Any]] | None = None  # a peer's replica count, shaped like Shoal's status
    inputs: dict[str, Any] | None = None  # model metadata, when the target cannot serve it
    slo_ms: dict[str, float] | None = None


def _check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the options, before anything starts (None: nothing)."""
    positive = {"--duration": args.duration, "--rate": args.rate, "--batch": args.batch,
                "--max-inflight": args.max_inflight, "--slo-ms": args.slo_ms, "--step-x": args.step_x,
                "--spike-s": args.spike_s, "--burst-s": args.burst_s, "--cv": args.cv, "--zipf": args.zipf}
    for name, value in positive.items():
        if value is not None and not (math.isfinite(value) and value > 0):
            return f"{name} {value:g}: must be a finite number > 0"
    not_negative = {"--drain-s": args.drain_s, "--users": args.users, "--base-rate": args.base_rate,
                    "--spike-at": args.spike_at, "--idle-s": args.idle_s}
    for name, value in not_negative.items():
        if value is not None and not (math.isfinite(value) and value >= 0):
            return f"{name} {value:g}: must be a finite number >= 0"
    if args.swing is not None and not (math.isfinite(args.swing) and args.swing >= 1):
        return f"--swing {args.swing:g}: peak over trough must be >= 1"
    if args.compare and not (Path(args.compare) / "summary.json").is_file():
        return f"--compare {args.compare}: no summary.json there (give the folder of an earlier run)"
    return None


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The Shoal run (or --target's), then each --peer on the same schedule; the report compares."""
    from loadtests import report
    from loadtests.peers import harness

    url = (args.target or args.url or os.environ.get("SHOAL_URL") or DEFAULT_URL).rstrip("/")
    if args.target:
        if not args.slo_ms:
            raise LoadTestError("--target needs --slo-ms: a peer has no function spec to read the SLO from")
        target = Target(url, args.target_name)
    else:
        token = args.token or os.environ.get("SHOAL_TOKEN") or _read_token(args.state_dir)
        target = Target(url, "shoal", plane=ControlPlane(url, token))
    if args.inputs:
        try:
            target.inputs = json.loads(Path(args.inputs).read_text())
        except (OSError, ValueError) as exc:
            raise LoadTestError(f"--inputs {args.inputs}: not a JSON file of model metadata ({exc})") from None
    peers = [k.strip() for k in (args.peer or "").split(",") if k.strip()]
    if peers and not args.model:
        raise LoadTestError("--peer needs --model: the ONNX file the peers serve (the function's own artifact)")
    try:
        summary, ts = run_one(args, out, target)
    finally:
        if target.plane is not None:
            target.plane.close()
    compare = Path(args.compare) if args.compare else None
    for kind in peers:
        inputs = json.loads((out / "inputs.json").read_text())
        function = summary["functions"][0]
        if len(summary["functions"]) != 1:
            raise LoadTestError("--peer serves one model: give one --function")
        try:
            with harness.start(kind, Path(args.model), function) as peer:
                peer.warm(function, _first_body(inputs[function], args), from_zero=args.from_zero)
                sample = functools.partial(peer.sample, function)
                run_one(args, out / f"peer-{kind}", Target(peer.url, peer.label, sample=sample, inputs=inputs,
                                                           slo_ms=summary["slo_ms"]))
        except harness.PeerUnavailable as exc:
            print(f"peer {kind}: not measured: {exc}", file=sys.stderr)
            continue
        compare = compare or out / f"peer-{kind}"
    if compare is not None:
        report.write(out, summary, ts, compare=compare)
    return summary


def run_one(args: argparse.Namespace, out: Path, target: Target) -> tuple[dict[str, Any], dict[str, Any]]:
    from loadtests import report

    functions = [f.strip() for f in args.function.split(",") if f.strip()]
    options = {key: getattr(args, attr) for attr, key in SCENARIO_OPTIONS.items() if getattr(args, attr) is not None}
    schedule = make_schedule(args.scenario, functions=functions, duration_s=args.duration, rate=args.rate,
                             seed=args.seed, **options)
    out.mkdir(parents=True, exist_ok=True)
    plane = target.plane
    specs = {f: plane.function(f) for f in schedule.functions} if plane else {}
    inputs = target.inputs or {f: _metadata(target.url, f, plane, args.from_zero) for f in schedule.functions}
    (out / "inputs.json").write_text(json.dumps(inputs, indent=1))
    if args.from_zero and plane is not None:
        _wait_for_zero(plane, schedule.functions, specs, args.quiet)
    before = plane.metrics() if plane else ""
    first_event = plane.last_event_id() if plane else 0
    devices = plane.status()["devices"] if plane else ([{"id": "cpu:0", "kind": "cpu", "emulated": False}]
                                                       if target.sample else [])
    if plane is not None:
        def sample() -> dict[str, Any]:
            status = plane.status()
            return {f: status["functions"].get(f, {}) for f in schedule.functions}
    else:
        sample = target.sample
    log = out / "requests.csv"
    if not args.quiet:
        print(f"{target.label}: {args.scenario}, {len(schedule)} requests over {schedule.duration_s:g} s -> {out}",
              flush=True)
    for f in schedule.functions:  # a body that cannot be built fails here, not inside Locust
        _first_body(inputs[f], args)
    proc = _start_locust(args, target.url, plane.token if plane else None, out, functions, options)
    try:
        samples, t0 = _watch(proc, sample, log, args, schedule)
        after = plane.metrics() if plane else ""
        events = plane.events_after(first_event) if plane else []
    finally:
        if proc.poll() is None:  # the runner failed (or was interrupted) while Locust ran: stop the load
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise LoadTestError(f"locust exited with {proc.returncode}:\n{_locust_tail(out)}")

    req = analysis.read_requests(log, t0)
    for s in samples:
        s["t"] -= t0
    counters = _counters(before, after, schedule.functions) if plane else {}
    if target.slo_ms:  # a peer is held to the SLO of the Shoal function it is compared with
        slo = target.slo_ms
    elif args.slo_ms:
        slo = {f: args.slo_ms for f in schedule.functions}
    else:
        slo = {f: float(specs[f]["scaling"]["slo_p95_ms"]) for f in schedule.functions}
    meta = {"scenario": args.scenario, "functions": list(schedule.functions), "duration_s": schedule.duration_s,
            "t0": t0, "loop": "closed" if args.users > 0 else "open", "url": target.url,
            "title": args.title if plane else (args.title or "the same schedule"),
            "target": target.label, "slo_ms": slo,
            "params": {**schedule.params, "users": args.users, "encoding": args.encoding, "batch": args.batch,
                       "slices": {f: specs[f]["slice"] for f in specs}}}
    closed = args.users > 0  # a closed loop has no offered schedule: what was sent is what was offered
    summary = analysis.summarize(meta=meta, req=req, offered=len(req) if closed else len(schedule),
                                 samples=samples, events=events,
                                 counters=counters, locust=_locust_totals(out),
                                 devices=devices)
    ts = analysis.timeseries(req, None if closed else schedule.offered_per_s(), samples, schedule.duration_s,
                             summary["slo_ms"])
    with open(out / "samples.jsonl", "w") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")
    (out / "events.json").write_text(json.dumps(events, indent=1))
    (out / "timeseries.json").write_text(json.dumps(ts))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False))
    report.write(out, summary, ts, compare=Path(args.compare) if args.compare and plane else None)
    return summary, ts


def _locust_totals(out: Path) -> dict[str, Any]:
    final = out / "locust_final.json"
    return {"csv": analysis.read_locust_totals(out / "locust_stats.csv"),
            "final": analysis.read_locust_json(final) if final.exists() else None}


def _locust_tail(out: Path) -> str:
    text = ""
    for name in ("locust.log", "locust.out"):
        try:
            text += (out / name).read_text()[-1500:]
        except OSError:
            pass
    return text.strip() or "(no output)"


def _first_body(metadata: dict[str, Any], args: argparse.Namespace):
    from loadtests.tensors import body_for

    return body_for(metadata, encoding=args.encoding, batch=args.batch, seed=args.seed)


def _metadata(url: str, function: str, plane: ControlPlane | None, from_zero: bool = False) -> dict[str, Any]:
    """A function's model metadata, to build requests from. From Shoal's control API, which
    starts nothing; where it cannot tell yet (no replica of the revision has answered, not an
    emulated profile), through the gateway, which may start a replica: refused with --from-zero,
    which must find the function at zero, untouched, when the load begins."""
    if plane is not None:
        try:
            return plane.metadata(function)
        except LoadTestError as exc:
            if from_zero:
                raise LoadTestError(f"--from-zero: {exc}; asking a replica would start {function} before the "
                                    "load: give --inputs (an earlier run's OUT/inputs.json)") from None
    # with the plane's token: inference may need it (--auth-inference)
    r = plane.http.get(f"/v2/models/{function}") if plane is not None else httpx.get(f"{url}/v2/models/{function}",
                                                                                      timeout=60)
    if r.status_code != 200:
        raise LoadTestError(f"GET {url}/v2/models/{function}: {r.status_code}; a target that serves no V2 "
                            "metadata cannot be load-tested without it")
    return r.json()


def _read_token(state_dir: str | None) -> str | None:
    path = Path(state_dir or os.environ.get("SHOAL_STATE_DIR") or ".shoal") / "token"
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _wait_for_zero(plane: ControlPlane, functions: tuple[str, ...], specs: dict[str, Any], quiet: bool) -> None:
    idle = max(float(specs[f]["scaling"]["idle_to_zero_s"]) for f in functions)
    deadline = time.monotonic() + idle + 60.0
    if not quiet:
        print(f"waiting for {', '.join(functions)} to scale to zero (idle_to_zero_s = {idle:g})", flush=True)
    while True:
        live = {f: plane.status()["functions"].get(f, {}) for f in functions}
        if all(v.get("ready", 0) + v.get("starting", 0) == 0 for v in live.values()):
            return
        if any(specs[f]["scaling"]["min_replicas"] > 0 for f in functions):
            raise LoadTestError("--from-zero: a function has min_replicas > 0 and never reaches zero")
        if time.monotonic() > deadline:
            raise LoadTestError(f"--from-zero: still running replicas after {idle + 60:g} s")
        time.sleep(0.5)


def _start_locust(args, url: str, token: str | None, out: Path, functions: list[str],
                  options: dict[str, Any]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", url,
           "--csv", str(out / "locust"), "--only-summary", "--loglevel", "WARNING",
           "--logfile", str(out / "locust.log"),
           "--exit-code-on-error", "0",  # failed requests are the report's business, not an error of the run
           "--json-file", str(out / "locust_final"),  # totals taken after the run ended (the CSVs are on a timer)
           "--stop-timeout", f"{max(1, math.ceil(args.drain_s))}s",  # closed loop: a stopping user finishes
           "--shoal-function", ",".join(functions), "--shoal-scenario", args.scenario,
           "--shoal-rate", str(args.rate), "--shoal-duration", str(args.duration), "--shoal-seed", str(args.seed),
           "--shoal-users", str(args.users), "--shoal-encoding", args.encoding, "--shoal-batch", str(args.batch),
           "--shoal-inputs", str(out / "inputs.json"), "--shoal-log", str(out / "requests.csv"),
           "--shoal-max-inflight", str(args.max_inflight), "--shoal-drain-s", str(args.drain_s),
           "--shoal-options", json.dumps(options)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if token and not args.target:
        env["LOCUST_SHOAL_TOKEN"] = token  # from the environment, not argv: `ps` shows argv
    return subprocess.Popen(cmd, stdout=open(out / "locust.out", "w"), stderr=subprocess.STDOUT, env=env)


def _watch(proc: subprocess.Popen, sample: Callable[[], dict[str, Any]] | None, log: Path,
           args, schedule) -> tuple[list[dict[str, Any]], float]:
    """Sample the control plane once a second and show progress until Locust ends; (samples, t0)."""
    samples: list[dict[str, Any]] = []
    tail = _Tail(log)
    t0_file = log.with_suffix(".t0")
    limit = time.monotonic() + args.duration + args.drain_s + 120.0
    last_print = 0.0
    tty = sys.stdout.isatty()
    while True:
        tick = time.monotonic()
        if sample is not None:
            samples.append({"t": time.time(), "functions": sample()})
        tail.read()
        t0 = _t0(t0_file)
        if not args.quiet and t0 is not None and (tty or tick - last_print >= 5.0):
            print(_progress(tail, t0, samples, schedule, tty), end="\r" if tty else "\n", flush=True)
            last_print = tick
        if proc.poll() is not None:
            break
        if tick > limit:
            proc.kill()
            proc.wait()
            raise LoadTestError(f"locust did not finish within {args.duration + args.drain_s + 120:g} s; killed")
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    if sample is not None:  # one last look, after the last answer
        samples.append({"t": time.time(), "functions": sample()})
    if tty and not args.quiet:
        print()
    t0 = _t0(t0_file)
    if t0 is None:
        raise LoadTestError(f"locust never started its schedule:\n{_locust_tail(log.parent)}")
    return samples, t0


def _t0(path: Path) -> float | None:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


class _Tail:
    """New rows of the request log as they are written (for the progress line only)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.rows = path, 0, []

    def read(self) -> None:
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        complete = chunk[: chunk.rfind("\n") + 1]
        self.offset += len(complete.encode())
        for line in complete.splitlines():
            parts = line.split(",")
            if parts and parts[0] != "start":
                try:
                    self.rows.append((float(parts[0]), float(parts[2]), int(parts[3])))
                except (ValueError, IndexError):
                    continue


def _progress(tail: _Tail, t0: float, samples: list[dict[str, Any]], schedule, tty: bool) -> str:
    now = time.time()
    recent = [r for r in tail.rows[-20000:] if r[0] + r[1] / 1000 >= now - 5]
    ok = [r[1] for r in recent if r[2] == 200]
    p95 = f"{np.percentile(ok, 95):6.1f} ms" if ok else "     - ms"
    failed = sum(1 for r in tail.rows if r[2] != 200)
    elapsed = now - t0
    offered = schedule.offered_per_s()
    i = min(int(elapsed), offered.size - 1)
    replicas = ""
    if samples:
        fns = samples[-1]["functions"].values()
        replicas = (f"  replicas {sum(f.get('ready', 0) for f in fns)} ready"
                    f" {sum(f.get('starting', 0) for f in fns)} starting  held {sum(f.get('held', 0) for f in fns)}")
    line = (f"  {elapsed:5.0f}/{schedule.duration_s:.0f} s  offered {offered[max(0, i - 4):i + 1].mean():6.1f}/s"
            f"  done {len(recent) / 5:6.1f}/s  p95 {p95}  failed {failed}{replicas}")
    return line.ljust(110) if tty else line


def _counters(before: str, after: str, functions: tuple[str, ...]) -> dict[str, Any]:
    b, a = analysis.counter_totals(before), analysis.counter_totals(after)
    requests = non_200 = cold = 0.0
    for f in functions:
        by_code = analysis.counter_delta(b, a, "shoal_gateway_requests_total", function=f)
        requests += sum(by_code.values())
        non_200 += sum(v for k, v in by_code.items() if k != "code=200")
        cold += sum(analysis.counter_delta(b, a, "shoal_scale_from_zero_total", function=f).values())
    return {"gateway": {"requests": int(round(requests)), "non_200": int(round(non_200))},
            "cold_starts": int(round(cold))}


def _print_headline(s: dict[str, Any]) -> None:
    slo = f"{s['slo_attainment'] * 100:.2f} %" if s["slo_attainment"] is not None else "-"
    print(f"\n{s['requests']} requests ({s['offered']} offered), {s['failures']} failed;"
          f" SLO attainment {slo}; p95 {_ms(s['latency_ms']['p95'])}")
    c = s["cost"]
    if c["static_peak"]["replica_slice_seconds"]:
        how = ("the control plane's count" if c.get("replica_slice_seconds_source") == "allocator"
               else "sampled once a second")
        print(f"cost {c['replica_slice_seconds']:.1f} replica-slice-seconds ({how}) = {c['vs_static']:.2f}x a static "
              f"peak allocation ({c['static_peak']['replica_slice_seconds']:.1f})")
    c = s["cold_starts"]
    if c.get("count") is not None:
        print(f"{c['count']} cold start(s) (a function raised from zero replicas), "
              f"{len(c['replica_starts'])} replica start(s)")
    if c["worst_wait_ms"] is not None:
        print(f"worst cold start seen by a request: {_ms(c['worst_wait_ms'])}")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


if __name__ == "__main__":
    sys.exit(main())
