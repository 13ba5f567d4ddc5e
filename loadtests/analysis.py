"""The numbers of a load-test report, from what a run recorded (pure: numpy, no I/O but the readers).

Inputs, all kept in the run's folder:
- `requests.csv`: one row per request from the locustfile (send time, scheduled
  time, latency, status, function, error, Shoal-Cold-Start header);
- `samples.jsonl`: the control plane's `/api/v1/status`, about once a second;
- `events.json`: the control plane's events during the run (scale decisions
  with their reasons, replica starts with their phases);
- the counters of the gateway's `/metrics` before and after;
- Locust's own `*_stats.csv`.

`summarize()` turns them into `summary.json`; `timeseries()` into the
per-second series the charts are drawn from. Costs:
- replica-slice-seconds: the slices every replica held over the run, read from
  the control plane's own count (`slice_seconds` per function in each status
  sample: each replica's slice from placement to release, exact) where it
  gives one, else the integral over the samples of the slice fractions of every
  replica that exists (starting, ready or draining), which rounds a state
  shorter than the second between samples to a whole second or none;
- device-seconds: the integral of the number of devices with at least one
  replica (GPU-seconds on GPU devices; the summary names the device kind and
  says when the devices are emulated);
- the static peak: the most replicas each function had at any sample, held for
  the whole run, and the whole devices that would take.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

NOT_SENT = "client: not sent"  # the locustfile's reason for an arrival it could not send (max in-flight)
GAVE_UP = "client: gave up"  # ... and for a request sent but not answered before the run ended
QUANTILES = {"p50": 50, "p90": 90, "p95": 95, "p99": 99}


@dataclass(frozen=True)
class Requests:
    """Every request of a run as columns; times are seconds since the run started."""

    start: np.ndarray
    scheduled: np.ndarray  # NaN in a closed loop
    latency_ms: np.ndarray
    status: np.ndarray  # 0: no HTTP response (connection error, refused by the client)
    function: np.ndarray  # object array of names
    error: np.ndarray
    cold: np.ndarray  # the Shoal-Cold-Start header, "" when the request did not wait for one

    def __len__(self) -> int:
        return int(self.start.size)

    @property
    def ok(self) -> np.ndarray:
        return self.status == 200

    @property
    def end(self) -> np.ndarray:
        return self.start + self.latency_ms / 1000.0


def read_requests(path: Path | str, t0: float) -> Requests:
    rows = list(csv.DictReader(open(path, newline="")))

    def column(name: str, kind: type = float) -> np.ndarray:
        if kind is float:
            return np.array([float(r[name]) if r[name] != "" else math.nan for r in rows], np.float64)
        return np.array([r[name] for r in rows], dtype=object)

    start = column("start") - t0
    scheduled = column("scheduled") - t0
    return Requests(start, scheduled, column("latency_ms"), column("status").astype(np.int64),
                    column("function", str), column("error", str), column("cold_start", str))


def read_samples(path: Path | str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in open(path) if line.strip()]


def read_locust_totals(path: Path | str) -> dict[str, int]:
    """The Aggregated row of Locust's `*_stats.csv`: its request and failure counts."""
    for row in csv.DictReader(open(path, newline="")):
        if row["Name"] == "Aggregated":
            return {"requests": int(row["Request Count"]), "failures": int(row["Failure Count"])}
    raise ValueError(f"{path}: no Aggregated row")


def read_locust_json(path: Path | str) -> dict[str, int]:
    """Totals of Locust's `--json-file` (one entry per request name, written at exit)."""
    entries = json.loads(Path(path).read_text())
    return {"requests": sum(int(e["num_requests"]) for e in entries),
            "failures": sum(int(e["num_failures"]) for e in entries)}


# shoal_scale_from_zero_total: the control plane's cold starts (a function raised from zero replicas)
COUNTERS = ("shoal_gateway_requests_total", "shoal_cold_start_seconds_count", "shoal_scale_from_zero_total")


def counter_totals(text: str, names: tuple[str, ...] = COUNTERS) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Samples of the named counters in a Prometheus text exposition, by sorted label set."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {n: {} for n in names}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in out:
                out[s.name][tuple(sorted(s.labels.items()))] = s.value
    return out


def counter_delta(before: dict, after: dict, name: str, **match: str) -> dict[str, float]:
    """after - before for counter `name`, keyed by the labels not in `match`, for the samples that match."""
    delta: dict[str, float] = {}
    for labels, value in after.get(name, {}).items():
        d = dict(labels)
        if any(d.get(k) != v for k, v in match.items()):
            continue
        key = ",".join(f"{k}={v}" for k, v in labels if k not in match)
        delta[key] = delta.get(key, 0.0) + value - before.get(name, {}).get(labels, 0.0)
    return delta


def quantiles(values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {**{k: None for k in QUANTILES}, "max": None, "mean": None}
    q = np.percentile(values, list(QUANTILES.values()))
    return {**{k: float(v) for k, v in zip(QUANTILES, q)}, "max": float(values.max()), "mean": float(values.mean())}


def slice_of(text: str) -> Fraction:
    return Fraction(text)


def timeseries(req: Requests, offered_per_s: np.ndarray | None, samples: list[dict[str, Any]], duration_s: float,
               slo_ms: dict[str, float]) -> dict[str, Any]:
    """Per-second series: offered, sent, answered 200, failed, latency quantiles, and the control plane's samples."""
    slo = np.array([slo_ms.get(f, math.inf) for f in req.function], np.float64)
    n = max(int(math.ceil(duration_s)), int(math.ceil(req.end.max())) if len(req) else 0,
            offered_per_s.size if offered_per_s is not None else 0, 1)
    sent = np.bincount(np.clip(req.start.astype(np.int64), 0, n - 1), minlength=n)[:n] if len(req) else np.zeros(n, int)
    end_bin = np.clip(req.end.astype(np.int64), 0, n - 1)
    ok = np.bincount(end_bin[req.ok], minlength=n)[:n]
    failed = np.bincount(end_bin[~req.ok], minlength=n)[:n]
    lat = {k: [None] * n for k in ("p50", "p95", "p99")}
    over = [0] * n
    for b in np.unique(end_bin[req.ok]) if len(req) else []:
        values = req.latency_ms[req.ok & (end_bin == b)]
        for k, v in zip(("p50", "p95", "p99"), np.percentile(values, [50, 95, 99])):
            lat[k][b] = float(v)
        over[b] = int(np.count_nonzero(values > slo[req.ok & (end_bin == b)]))
    offered = None
    if offered_per_s is not None:  # open loop; a closed loop has no schedule
        offered = np.zeros(n, np.int64)
        offered[:min(n, offered_per_s.size)] = offered_per_s[:n]
    replicas: dict[str, list] = {"t": [], "ready": [], "starting": [], "desired": [], "held": []}
    duty: dict[str, dict[str, Any]] = {}
    for s in samples:
        replicas["t"].append(s["t"])
        fns = s["functions"].values()
        replicas["ready"].append(sum(f.get("ready", 0) for f in fns))
        replicas["starting"].append(sum(f.get("starting", 0) for f in fns))
        replicas["desired"].append(sum(f.get("desired") or 0 for f in fns))
        replicas["held"].append(sum(f.get("held", 0) for f in fns))
        for name, f in s["functions"].items():
            for r in f.get("replicas", []):
                row = duty.setdefault(r["id"], {"function": name, "slice": r.get("slice"), "device": r.get("device"),
                                                "t": [], "duty": []})
                row["t"].append(s["t"])
                row["duty"].append(r.get("duty"))
    line = min(slo_ms.values(), default=math.inf)
    return {"seconds": n, "slo_ms": line if math.isfinite(line) else None,
            "offered": offered.tolist() if offered is not None else None,
            "sent": sent.tolist(), "ok": ok.tolist(), "failed": failed.tolist(), "latency_ms": lat, "over_slo": over,
            "replicas": replicas, "duty": duty}


LIVE_STATES = ("starting", "ready", "draining")  # a replica holds its slice until it has stopped


def held_slice_seconds(samples: list[dict[str, Any]], t_end: float) -> float | None:
    """The slice-seconds the functions' replicas held from the first sample to `t_end`, from the
    control plane's count in each function's status (`slice_seconds`: since it began, each
    replica's slice from placement to release; `slices_held`: now): the count of the last sample
    at or before `t_end` less the first's, plus the slices held at that sample until `t_end`, so
    the span is the sampled integral's (costs), but no more than the count of the first sample
    past `t_end` (a replica that stopped in between). None where a sample lacks it (a plane that
    does not count: the samples' integral stands). E.g. 12.0 then 40.5 slice-s, 0.25 held at the
    last sample, 2 s before t_end: 28.5 + 0.5 = 29.0; were the next sample's count 40.6: 28.6."""
    if not samples:
        return None
    within = [s for s in samples if s["t"] <= t_end] or samples[:1]
    after = samples[len(within)] if len(within) < len(samples) else None  # the first sample past t_end
    if any("slice_seconds" not in f for s in (within[0], within[-1], *([after] if after else []))
           for f in s["functions"].values()):
        return None
    first, last = within[0], within[-1]
    total = 0.0
    for name, f in last["functions"].items():
        before = first["functions"].get(name, {}).get("slice_seconds", 0.0)
        at_end = f["slice_seconds"] + f.get("slices_held", 0.0) * max(0.0, t_end - last["t"])
        if after is not None:  # a replica that stopped before t_end held its slice no longer than that
            at_end = min(at_end, after["functions"].get(name, {}).get("slice_seconds", at_end))
        total += at_end - before
    return total


def costs(samples: list[dict[str, Any]], t_end: float, devices: list[dict[str, Any]]) -> dict[str, Any]:
    """Replica-slice-seconds and device-seconds over the samples (each value held until the next sample,
    and nothing counted past `t_end`), beside a static allocation of each function's peak for the whole span:
    the most slice it held at any sample (so slices resized by the controller count at their size). The
    replica-slice-seconds are the control plane's exact count where the samples carry it
    (held_slice_seconds), the samples' integral (also given as `replica_slice_seconds_sampled`) where not."""
    slice_s = replica_s = device_s = 0.0
    peak_replicas: dict[str, int] = {}
    peak_slices: dict[str, Fraction] = {}
    for i, s in enumerate(samples):
        until = min(t_end, samples[i + 1]["t"]) if i + 1 < len(samples) else t_end
        dt = max(0.0, until - s["t"])
        used_devices = set()
        for name, f in s["functions"].items():
            live = [r for r in f.get("replicas", []) if r.get("state") in LIVE_STATES]
            held = sum((slice_of(r.get("slice") or f.get("slice") or "1") for r in live), Fraction(0))
            peak_replicas[name] = max(peak_replicas.get(name, 0), len(live))
            peak_slices[name] = max(peak_slices.get(name, Fraction(0)), held)
            slice_s += float(held) * dt
            replica_s += len(live) * dt
            used_devices.update(r.get("device") for r in live)
        device_s += len(used_devices) * dt
    span = max(0.0, t_end - samples[0]["t"]) if samples else 0.0
    static_slices = sum(peak_slices.values(), Fraction(0))
    static_slice_s = float(static_slices) * span
    kinds = sorted({d.get("kind", "?") for d in devices})
    held = held_slice_seconds(samples, t_end)
    measured = held if held is not None else slice_s
    return {
        "replica_slice_seconds": measured,
        "replica_slice_seconds_source": "allocator" if held is not None else "samples",
        "replica_slice_seconds_sampled": slice_s,
        "replica_seconds": replica_s, "device_seconds": device_s,
        "gpu_seconds": device_s if "gpu" in kinds else None,
        "static_peak": {"replicas": peak_replicas, "slices": {k: str(v) for k, v in peak_slices.items()},
                        "replica_slice_seconds": static_slice_s,
                        "device_seconds": math.ceil(static_slices) * span},
        "vs_static": measured / static_slice_s if static_slice_s > 0 else None,
        "device_kinds": kinds, "emulated": any(d.get("emulated") for d in devices), "span_s": span,
    }


def cold_starts(req: Requests, events: list[dict[str, Any]], t0: float) -> dict[str, Any]:
    """Replica starts during the run with their phases, and what the requests that waited for one saw
    (the cold starts, a function raised from zero, are the control plane's counter: summarize's `count`)."""
    starts = []
    for e in events:
        if e["kind"] == "replica_ready" and e.get("data"):
            d = e["data"]
            spawn = float(d.get("spawn_s", 0.0))
            ready = float(d.get("ready_s", spawn))
            starts.append({"t": e["at"] - t0, "replica": d.get("replica"), "function": e.get("function"),
                           "spawn_s": spawn, "load_s": max(0.0, ready - spawn), "ready_s": ready})
    waited = np.array([c != "" for c in req.cold], bool) if len(req) else np.zeros(0, bool)
    phases: dict[str, list[float]] = {}
    for header in req.cold[waited]:
        for part in header.split(","):
            key, _, value = part.strip().partition("=")
            try:
                phases.setdefault(key, []).append(float(value))
            except ValueError:
                continue
    worst = float(req.latency_ms[waited].max()) if waited.any() else None
    return {"replica_starts": starts, "requests_held": int(waited.sum()), "worst_wait_ms": worst,
            "phases_max_s": {k: max(v) for k, v in phases.items()},
            "phases_mean_s": {k: sum(v) / len(v) for k, v in phases.items()}}


def scale_decisions(events: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    out = []
    for e in events:
        if e["kind"] in ("scale", "slice", "unplaceable", "replica_failed"):
            d = e.get("data") or {}
            out.append({"t": e["at"] - t0, "kind": e["kind"], "function": e.get("function"),
                        "from": d.get("from"), "to": d.get("to"), "reason": d.get("reason", e["kind"].upper()),
                        "message": e["message"]})
    return out


def summarize(*, meta: dict[str, Any], req: Requests, offered: int, samples: list[dict[str, Any]],
              events: list[dict[str, Any]], counters: dict[str, Any], locust: dict[str, int],
              devices: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json: the headline, latency, cost, cold starts, decisions and the cross-checks."""
    duration = float(meta["duration_s"])
    events = [e for e in events if e.get("function") in meta["functions"]]  # other functions' events are not ours
    slo_by_function: dict[str, float] = meta["slo_ms"]
    ok = req.ok
    n = len(req)
    failures = int(n - ok.sum())
    lat_ok = req.latency_ms[ok]
    slo = np.array([slo_by_function.get(f, math.inf) for f in req.function], np.float64)
    met = int(np.count_nonzero(ok & (req.latency_ms <= slo)))  # a failed request never meets its SLO
    statuses: dict[str, int] = {}
    for code, err in zip(req.status[~ok].tolist(), req.error[~ok].tolist()):
        key = str(code) if code else (err[:80] if err.startswith("client:") else "no response")
        statuses[key] = statuses.get(key, 0) + 1
    lag = req.start - req.scheduled
    lag = lag[np.isfinite(lag)]
    t_end = max(duration, float(req.end.max()) if n else 0.0)
    cost = costs(samples, t_end, devices)
    live = [r + s for r, s in zip(*_counts(samples))]  # ready + starting, per sample
    gateway = counters.get("gateway", {})
    sent_to_gateway = n - sum(v for k, v in statuses.items() if k.startswith(NOT_SENT))
    http_errors = int(np.count_nonzero((req.status != 200) & (req.status != 0)))
    # sent, then the client stopped waiting: the gateway answered it anyway (200) or saw the client leave (499)
    gave_up = sum(v for k, v in statuses.items() if k.startswith(GAVE_UP))
    return {
        "title": meta.get("title") or f"{meta['scenario']} on {', '.join(meta['functions'])}",
        "scenario": meta["scenario"], "functions": meta["functions"], "loop": meta["loop"],
        "target": meta.get("target", "shoal"), "url": meta.get("url"), "started_at": meta["t0"],
        "duration_s": duration, "params": meta.get("params", {}),
        "slo_ms": slo_by_function,
        "requests": n, "failures": failures, "ok": int(ok.sum()),
        "offered": offered, "offered_rate": offered / duration if duration else None,
        "achieved_rate": int(ok.sum()) / duration if duration else None,
        "slo_attainment": met / n if n else None,
        "latency_ms": quantiles(lat_ok),
        "errors_by_status": dict(sorted(statuses.items())),
        "client_send_lag_ms": quantiles(lag * 1000.0) if lag.size else None,
        "replicas": {"peak": max(live, default=0), "mean": float(np.mean(live)) if live else 0.0},
        "cost": cost,
        "replica_slice_seconds": cost["replica_slice_seconds"],
        "static_peak_replica_slice_seconds": cost["static_peak"]["replica_slice_seconds"],
        "cold_starts": {"count": counters.get("cold_starts"), **cold_starts(req, events, meta["t0"])},
        "scale_decisions": scale_decisions(events, meta["t0"]),
        "checks": {
            "locust": locust,
            "gateway_requests": gateway.get("requests"), "gateway_non_200": gateway.get("non_200"),
            "sent_to_gateway": sent_to_gateway, "http_errors": http_errors, "gave_up": gave_up,
            "locust_agrees": _agrees(locust.get("final") or locust.get("csv"), n, failures),
            "locust_csv_agrees": _agrees(locust.get("csv"), n, failures),
            "gateway_agrees": None if not gateway else (
                gateway.get("requests") == sent_to_gateway
                and http_errors <= gateway.get("non_200", -1) <= http_errors + gave_up),
        },
    }


def _agrees(totals: dict[str, int] | None, requests: int, failures: int) -> bool | None:
    if not totals:
        return None
    return totals.get("requests") == requests and totals.get("failures") == failures


def _counts(samples: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Ready and starting replicas per sample (as the control plane counts them)."""
    ready = [sum(f.get("ready", 0) for f in s["functions"].values()) for s in samples]
    starting = [sum(f.get("starting", 0) for f in s["functions"].values()) for s in samples]
    return ready, starting
