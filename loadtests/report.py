"""The load-test report: charts as PNG files and one self-contained HTML page.

`write(out, summary, timeseries, compare=OTHER_DIR)` draws the charts with
matplotlib (Agg, no display) into `out/*.png` and writes `out/report.html`
with the same images inlined as data URIs, so the page reads offline and can
be mailed as one file. No script and no external resource: the page loads
nothing. With `compare`, another run's summary and series are set beside this
one (a headline table and overlaid charts).

Every chart over time shares one axis, the run's start (0) to its end
(`ts["seconds"]`, the last second a request was sent or answered): a sample
taken before the schedule began or after the last answer sets the first or
last step but widens no chart.
"""

from __future__ import annotations

import base64
import html
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

COLORS = {"p50": "#4c78a8", "p95": "#f58518", "p99": "#e45756", "slo": "#222222", "offered": "#9d9d9d",
          "ok": "#54a24b", "failed": "#e45756", "ready": "#4c78a8", "starting": "#9ecae9", "desired": "#222222",
          "held": "#b279a2", "spawn": "#72b7b2", "load": "#4c78a8", "other": "#f58518"}


def write(out: Path, summary: dict[str, Any], ts: dict[str, Any], compare: Path | None = None) -> Path:
    other = None
    if compare is not None:
        try:
            other = (json.loads((compare / "summary.json").read_text()),
                     json.loads((compare / "timeseries.json").read_text()))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--compare {compare}: not a load-test report folder ({exc})") from None
    charts = draw(out, summary, ts, other)
    page = render_html(summary, charts, other)
    path = out / "report.html"
    path.write_text(page)
    return path


# ---------------------------------------------------------------------- charts


def draw(out: Path, s: dict[str, Any], ts: dict[str, Any], other: tuple[dict, dict] | None) -> dict[str, Path]:
    """Every chart of the report as a PNG in `out`, by name; a chart with nothing to show is left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "figure.dpi": 100})
    decisions = [d for d in s["scale_decisions"] if d["kind"] == "scale"]
    figures = {
        "latency": _latency_chart(plt, ts, decisions),
        "throughput": _throughput_chart(plt, ts),
        "replicas": _replicas_chart(plt, ts, decisions),
        "duty": _duty_chart(plt, matplotlib, ts),
        "coldstarts": _cold_start_chart(plt, s),
        "errors": _errors_chart(plt, s),
        "compare": _compare_chart(plt, s, ts, other) if other is not None else None,
    }
    charts: dict[str, Path] = {}
    for name, fig in figures.items():
        if fig is None:
            continue
        charts[name] = out / f"{name}.png"
        fig.tight_layout()
        fig.savefig(charts[name], dpi=100)
        plt.close(fig)
    return charts


def _latency_chart(plt, ts: dict[str, Any], decisions: list[dict]):
    """Latency against the SLO, at the middle of each second."""
    x = np.arange(ts["seconds"])
    fig, ax = plt.subplots(figsize=(10, 3.4))
    for k in ("p50", "p95", "p99"):
        ax.plot(x + 0.5, _nan(ts["latency_ms"][k]), label=k, color=COLORS[k], lw=1.2, marker=".", ms=3)
    if ts["slo_ms"] is not None:
        ax.axhline(ts["slo_ms"], color=COLORS["slo"], ls="--", lw=1, label=f"SLO {ts['slo_ms']:g} ms")
    _mark_decisions(ax, decisions, label=False)
    ax.set_yscale("log")
    ax.set_xlim(*time_axis(ts))
    ax.set(xlabel="seconds since start", ylabel="latency (ms, log)", title="Latency of answered requests, per second")
    ax.legend(loc="upper right", ncol=4)
    return fig


def _throughput_chart(plt, ts: dict[str, Any]):
    """Offered against achieved rate, and failures, per second."""
    x = np.arange(ts["seconds"])
    fig, ax = plt.subplots(figsize=(10, 3.0))
    if ts["offered"] is not None:
        ax.step(*_seconds(ts["offered"]), where="post", color=COLORS["offered"], label="offered (schedule)", lw=1.5)
    else:
        ax.step(*_seconds(ts["sent"]), where="post", color=COLORS["offered"], label="sent (closed loop)", lw=1.5)
    ax.step(*_seconds(ts["ok"]), where="post", color=COLORS["ok"], label="answered 200", lw=1.2)
    if any(ts["failed"]):
        ax.bar(x + 0.5, ts["failed"], color=COLORS["failed"], label="failed", width=0.9, alpha=0.8)
    ax.set_xlim(*time_axis(ts))
    ax.set(xlabel="seconds since start", ylabel="requests / s", title="Offered vs achieved rate")
    ax.legend(loc="upper right", ncol=3)
    return fig


def _replicas_chart(plt, ts: dict[str, Any], decisions: list[dict]):
    """Replicas ready and starting, the desired count, held requests, and every scale decision."""
    rep = ts["replicas"]
    if not rep["t"]:
        return None
    fig, ax = plt.subplots(figsize=(10, 3.4))
    t = np.array(rep["t"])
    ready, starting = np.array(rep["ready"]), np.array(rep["starting"])
    ax.fill_between(t, 0, ready, step="post", color=COLORS["ready"], alpha=0.8, label="ready")
    ax.fill_between(t, ready, ready + starting, step="post", color=COLORS["starting"], alpha=0.9, label="starting")
    ax.step(t, rep["desired"], where="post", color=COLORS["desired"], ls="--", lw=1, label="desired")
    if any(rep["held"]):
        ax2 = ax.twinx()
        ax2.step(t, rep["held"], where="post", color=COLORS["held"], lw=1, label="held at the activator")
        ax2.set_ylabel("requests held", color=COLORS["held"])
        ax2.grid(False)
    _mark_decisions(ax, decisions, label=True)
    ax.set_xlim(*time_axis(ts))
    ax.set(xlabel="seconds since start", ylabel="replicas", title="Replicas, with every scale decision and its reason")
    ax.set_ylim(0, max(1, max(ready + starting, default=0), max(rep["desired"], default=0)) + 1)
    ax.legend(loc="upper left", ncol=3)
    return fig


def _duty_chart(plt, matplotlib, ts: dict[str, Any]):
    """Each replica's slice duty cycle per second, as a heatmap (grey: not running)."""
    duty = ts["duty"]
    if not duty:
        return None
    ids, grid = duty_grid(duty, ts["seconds"])
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.35 * len(ids)))
    cmap = matplotlib.colormaps["viridis"].copy()
    cmap.set_bad("#eeeeee")
    # column i is second [i, i + 1): the extent puts it there on the shared axis
    im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap=cmap, vmin=0, vmax=1, interpolation="nearest",
                   extent=(0, ts["seconds"], len(ids) - 0.5, -0.5))
    ax.set_xlim(*time_axis(ts))
    ax.set_yticks(range(len(ids)), [f"{rid} ({duty[rid]['slice']})" for rid in ids])
    ax.set(xlabel="seconds since start", title="Duty cycle of each replica's slice (grey: not running)")
    ax.grid(False)
    fig.colorbar(im, ax=ax, label="busy fraction", pad=0.01)
    return fig


def _cold_start_chart(plt, s: dict[str, Any]):
    """Each replica start split into spawn and load."""
    starts = s["cold_starts"]["replica_starts"]
    if not starts:
        return None
    fig, ax = plt.subplots(figsize=(10, 1.0 + 0.35 * len(starts)))
    y = np.arange(len(starts))
    spawn = np.array([c["spawn_s"] for c in starts]) * 1000
    load = np.array([c["load_s"] for c in starts]) * 1000
    ax.barh(y, spawn, color=COLORS["spawn"], label="spawn (process up)")
    ax.barh(y, load, left=spawn, color=COLORS["load"], label="load (model ready)")
    ax.set_yticks(y, [f"{c['replica']} at {c['t']:.0f} s" for c in starts])
    ax.invert_yaxis()
    ax.set(xlabel="ms", title="Replica starts by phase")
    ax.legend(loc="lower right")
    return fig


def _errors_chart(plt, s: dict[str, Any]):
    """Failed requests by status."""
    if not s["errors_by_status"]:
        return None
    fig, ax = plt.subplots(figsize=(10, 2.4))
    keys = list(s["errors_by_status"])
    ax.barh(keys, [s["errors_by_status"][k] for k in keys], color=COLORS["failed"])
    ax.set(xlabel="requests", title="Failed requests by status")
    return fig


def _compare_chart(plt, s: dict[str, Any], ts: dict[str, Any], other: tuple[dict, dict]):
    """p95 and replicas of this run beside another's, each from its own start."""
    o, ots = other
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.6), sharex=True)
    for series, label, style in ((ts, _label(s), "-"), (ots, _label(o), "--")):
        xs = np.arange(series["seconds"])
        axes[0].plot(xs, _nan(series["latency_ms"]["p95"]), ls=style, lw=1.2, marker=".", ms=3, label=f"p95 {label}")
        r = series["replicas"]
        if r["t"]:
            axes[1].step(r["t"], np.add(r["ready"], r["starting"]), where="post", ls=style, lw=1.3, label=label)
    if ts["slo_ms"] is not None:
        axes[0].axhline(ts["slo_ms"], color=COLORS["slo"], ls=":", lw=1, label="SLO")
    axes[0].set(yscale="log", ylabel="p95 latency (ms, log)", title="Side by side")
    axes[1].set_xlim(0, max(ts["seconds"], ots["seconds"]))  # the longer run's axis, both from their start
    axes[1].set(xlabel="seconds since start", ylabel="replicas (ready + starting)")
    axes[0].legend(loc="upper right")
    axes[1].legend(loc="upper right")
    return fig


def time_axis(ts: dict[str, Any]) -> tuple[float, float]:
    """The one x-range of every chart over time: the run's start to its end, in seconds."""
    return 0.0, float(ts["seconds"])


def duty_grid(duty: dict[str, dict[str, Any]], seconds: int) -> tuple[list[str], np.ndarray]:
    """Replica ids (by first sample) and their duty per second of the run: one column per second,
    the last sample in it; NaN where the replica was not sampled (not running, or outside the run)."""
    ids = sorted(duty, key=lambda r: duty[r]["t"][0])
    grid = np.full((len(ids), seconds), np.nan)
    for i, rid in enumerate(ids):
        for t, v in zip(duty[rid]["t"], duty[rid]["duty"]):
            if v is not None and 0 <= t < seconds:
                grid[i, int(t)] = v
    return ids, grid


def _seconds(values: list) -> tuple[np.ndarray, np.ndarray]:
    """A per-second series as steps over [0, n]: the last value repeated so its second is drawn whole."""
    return np.arange(len(values) + 1), np.array([*values, values[-1]] if values else [0])


def _nan(values: list) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], float)


def _mark_decisions(ax, decisions: list[dict[str, Any]], label: bool) -> None:
    top = ax.get_ylim()[1]
    for d in decisions:
        color = "#54a24b" if (d["to"] or 0) > (d["from"] or 0) else "#e45756"
        ax.axvline(d["t"], color=color, lw=0.8, alpha=0.6)
        if label:
            ax.annotate(f"{d['from']}→{d['to']} {d['reason']}", (d["t"], top), xytext=(2, -2),
                        textcoords="offset points",
                        rotation=90, va="top", fontsize=7, color=color)


def _label(s: dict[str, Any]) -> str:
    return s.get("label") or f"{s.get('target', 'shoal')}: {s['title']}"


# ---------------------------------------------------------------------- HTML


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
main{max-width:1080px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#666;margin-bottom:16px}
.headline{display:grid;grid-template-columns:repeat(3,1fr);gap:12px;margin:16px 0}
.card{background:#fff;border:1px solid #ddd;border-radius:8px;padding:12px 16px}
.card .big{font-size:30px;font-weight:600}
.card .what{color:#666;font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.good{color:#2a7d2a}.bad{color:#b3261e}.note{color:#666;font-size:12px}
table{border-collapse:collapse;background:#fff;width:100%;margin:6px 0}
th,td{border:1px solid #e3e3e3;padding:4px 8px;text-align:left;font-variant-numeric:tabular-nums}
th{background:#f2f2f2;font-weight:600}td.n{text-align:right}
img{max-width:100%;background:#fff;border:1px solid #ddd;border-radius:6px;margin:6px 0}
code{background:#f0f0f0;padding:1px 4px;border-radius:3px}
"""


def render_html(s: dict[str, Any], charts: dict[str, Path], other: tuple[dict, dict] | None = None) -> str:
    e = html.escape
    started = datetime.fromtimestamp(s["started_at"]).strftime("%Y-%m-%d %H:%M:%S")
    cost = s["cost"]
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
             f"<meta name='viewport' content='width=device-width,initial-scale=1'>"
             f"<title>Shoal load test: {e(s['title'])}</title><style>{CSS}</style></head><body><main>",
             f"<h1>Load test: {e(s['title'])}</h1>",
             f"<div class='sub'>{e(s['target'])} at <code>{e(str(s['url']))}</code>"
             f" · scenario <b>{e(s['scenario'])}</b>"
             f" ({e(s['loop'])} loop) · {s['duration_s']:g} s from {started} · "
             f"functions {e(', '.join(s['functions']))}</div>",
             _headline(s)]
    if other is not None:
        parts.append(_comparison(s, other[0], charts))
    parts += [
        "<h2>Latency against the SLO</h2>", _img(charts, "latency"),
        _table(["", "p50", "p90", "p95", "p99", "max", "mean"],
               [["answered 200 (ms)", *[_f(s["latency_ms"][k]) for k in ("p50", "p90", "p95", "p99", "max", "mean")]]]),
        f"<p class='note'>SLO: {e(', '.join(f'{k} {v:g} ms' for k, v in s['slo_ms'].items()))}; a request meets it "
        f"when it is answered 200 within that time. Failed requests count as missed.</p>",
        "<h2>Offered vs achieved</h2>", _img(charts, "throughput"),
        ("<p>A closed loop: each user sent its next request when the last came back, so what was offered is what "
         "was sent; overload shows as a lower rate, not as latency. " if s["loop"] == "closed" else "<p>")
        + f"{s['offered']} requests offered ({_f(s['offered_rate'])}/s on average), {s['requests']} sent, "
        f"{s['ok']} answered 200 ({_f(s['achieved_rate'])}/s), {s['failures']} failed."
        + (f" Client send lag p99 {_f(s['client_send_lag_ms']['p99'])} ms (how late the load generator sent)."
           if s.get("client_send_lag_ms") else "") + "</p>",
    ]
    if "replicas" in charts:
        parts += ["<h2>Replicas and scale decisions</h2>", _img(charts, "replicas"), _decisions(s)]
    if "duty" in charts:
        parts += ["<h2>Duty cycle per slice</h2>", _img(charts, "duty"),
                  "<p class='note'>The busy fraction of each replica's executor over the control plane's window, "
                  "sampled once a second.</p>"]
    parts += ["<h2>Cold starts</h2>", _cold(s), _img(charts, "coldstarts")]
    parts += ["<h2>Errors</h2>", _errors(s), _img(charts, "errors")]
    parts += ["<h2>Cost</h2>", _cost(cost), "<h2>Cross-checks</h2>", _checks(s),
              "<h2>Run</h2>",
              _table(["parameter", "value"], [[e(k), e(json.dumps(v))] for k, v in s["params"].items()]),
              "<p class='note'>Files beside this page: summary.json, timeseries.json, "
              "requests.csv (one row per request), "
              "locust_stats.csv and the other Locust CSVs, samples.jsonl (the control plane once a second), "
              "events.json, and every chart as PNG.</p>",
              "</main></body></html>"]
    return "\n".join(p for p in parts if p)


def _headline(s: dict[str, Any]) -> str:
    att = s["slo_attainment"]
    att_text = "-" if att is None else f"{att * 100:.2f}%"
    cls = "" if att is None else ("good" if att >= 0.99 else "bad")
    vs = s["cost"]["vs_static"]
    vs_text = "-" if vs is None else f"{vs:.2f}×"
    worst = s["cold_starts"]["worst_wait_ms"]
    starts = len(s["cold_starts"]["replica_starts"])
    count = s["cold_starts"].get("count")
    cold = "" if count is None else f"{count} cold start(s) from zero; "
    return (
        "<div class='headline'>"
        f"<div class='card'><div class='what'>SLO attainment</div><div class='big {cls}'>{att_text}</div>"
        f"<div class='note'>{s['requests']} requests, {s['failures']} failed, "
        f"p95 {_f(s['latency_ms']['p95'])} ms</div></div>"
        f"<div class='card'><div class='what'>Cost vs static peak</div><div class='big'>{vs_text}</div>"
        f"<div class='note'>{_f(s['cost']['replica_slice_seconds'])} of "
        f"{_f(s['cost']['static_peak']['replica_slice_seconds'])}"
        " replica-slice-seconds</div></div>"
        f"<div class='card'><div class='what'>Worst cold start</div><div class='big'>"
        f"{'none' if worst is None else _f(worst) + ' ms'}</div>"
        f"<div class='note'>{cold}{starts} replica start(s); {s['cold_starts']['requests_held']} request(s) held"
        "</div></div>"
        "</div>")


def _same_measure(a: dict[str, Any], b: dict[str, Any]) -> tuple[Any, Any]:
    """Two runs' replica-slice-seconds by one measure: the control plane's count where both have it,
    else both sampled (a run recorded before the count, or on a plane without one, has only that)."""
    if a.get("replica_slice_seconds_source") == b.get("replica_slice_seconds_source") == "allocator":
        return a["replica_slice_seconds"], b["replica_slice_seconds"]
    return (a.get("replica_slice_seconds_sampled", a["replica_slice_seconds"]),
            b.get("replica_slice_seconds_sampled", b["replica_slice_seconds"]))


def _comparison(s: dict[str, Any], o: dict[str, Any], charts: dict[str, Path]) -> str:
    def row(name: str, a: Any, b: Any, lower_is_better: bool = True) -> list[str]:
        ratio = (a / b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
        return [name, _f(a), _f(b), "-" if ratio is None else f"{ratio:.2f}×"]

    rows = [
        row("SLO attainment (%)", _pct(s["slo_attainment"]), _pct(o["slo_attainment"]), False),
        row("requests", s["requests"], o["requests"]), row("failed", s["failures"], o["failures"]),
        row("p50 (ms)", s["latency_ms"]["p50"], o["latency_ms"]["p50"]),
        row("p95 (ms)", s["latency_ms"]["p95"], o["latency_ms"]["p95"]),
        row("p99 (ms)", s["latency_ms"]["p99"], o["latency_ms"]["p99"]),
        row("replica-slice-seconds", *_same_measure(s["cost"], o["cost"])),
        row("peak replicas", s["replicas"]["peak"], o["replicas"]["peak"]),
        row("cold starts (from zero)", s["cold_starts"].get("count"), o["cold_starts"].get("count")),
        row("replica starts", len(s["cold_starts"]["replica_starts"]), len(o["cold_starts"]["replica_starts"])),
        row("worst cold start (ms)", s["cold_starts"]["worst_wait_ms"], o["cold_starts"]["worst_wait_ms"]),
    ]
    return ("<h2>Side by side</h2>"
            + _table(["", html.escape(_label(s)), html.escape(_label(o)), "this / other"], rows)
            + _img(charts, "compare"))


def _decisions(s: dict[str, Any]) -> str:
    rows = [[f"{d['t']:.1f}", html.escape(d["function"] or ""), html.escape(d["kind"]), html.escape(d["reason"] or ""),
             html.escape(d["message"])] for d in s["scale_decisions"]]
    if not rows:
        return "<p>No scale decision changed the replica count during the run.</p>"
    return _table(["t (s)", "function", "kind", "reason", "what the controller said"], rows)


def _cold(s: dict[str, Any]) -> str:
    c = s["cold_starts"]
    if not c["replica_starts"] and not c["requests_held"]:
        return "<p>No replica started during the run and no request waited for one.</p>"
    phases = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in c["phases_max_s"].items())
    head = ("<p>" + (f"{c['count']} cold start(s), each a function raised from zero replicas; "
                     if c.get("count") is not None else "")
            + f"{len(c['replica_starts'])} replica start(s) during the run"
            + f"; {c['requests_held']} request(s) waited for one; the worst waited {_f(c['worst_wait_ms'])} ms in all."
            + (f" Longest phases seen by a request: {html.escape(phases)}." if phases else "") + "</p>")
    rows = [[f"{x['t']:.1f}", html.escape(str(x["replica"])), _f(x["spawn_s"] * 1000), _f(x["load_s"] * 1000),
             _f(x["ready_s"] * 1000)] for x in c["replica_starts"]]
    return head + (_table(["t (s)", "replica", "spawn (ms)", "load (ms)", "ready (ms)"], rows) if rows else "")


def _errors(s: dict[str, Any]) -> str:
    if not s["errors_by_status"]:
        return "<p>No failed request.</p>"
    return _table(["status", "requests"], [[html.escape(k), str(v)] for k, v in s["errors_by_status"].items()])


def _cost(c: dict[str, Any]) -> str:
    kinds = ", ".join(c["device_kinds"]) or "none sampled"
    unit = "GPU-seconds" if "gpu" in c["device_kinds"] else "device-seconds"
    label = f"{unit} ({kinds}{', emulated' if c['emulated'] else ''})"
    rows = [["replica-slice-seconds", _f(c["replica_slice_seconds"]), _f(c["static_peak"]["replica_slice_seconds"])],
            [label, _f(c["device_seconds"]), _f(c["static_peak"]["device_seconds"])]]
    note = ("<p class='note'>Static peak: each function's most replicas at any sample "
            f"({html.escape(json.dumps(c['static_peak']['replicas']))}) held for the whole {c['span_s']:.0f} s, "
            "on as many whole devices as their slices fill. Measured: "
            + ("each replica's slice from its placement to the release of its slice, as the control plane "
               f"counted it (sampled once a second instead: {c['replica_slice_seconds_sampled']:.1f})."
               if c.get("replica_slice_seconds_source") == "allocator" else
               "the slices of every starting, ready or draining replica, sampled once a second.")
            + (" The devices are emulated: these are not GPU measurements." if c["emulated"] else "")
            + (" No GPU was used: the device is the CPU."
               if "gpu" not in c["device_kinds"] and not c["emulated"] else "")
            + "</p>")
    return _table(["", "this run", "static peak allocation"], rows) + note


def _checks(s: dict[str, Any]) -> str:
    k = s["checks"]
    ours = f"{s['requests']} / {s['failures']}"
    rows = []
    for key, source, agrees in (("final", "Locust's totals at exit (--json-file)", "locust_agrees"),
                                ("csv", "Locust's stats CSV", "locust_csv_agrees")):
        totals = k["locust"].get(key)
        if totals:
            rows.append([f"{source} (requests / failures)", f"{totals['requests']} / {totals['failures']}", ours,
                         _yes(k[agrees])])
    if k.get("gateway_requests") is not None:
        gave_up = f" (+ up to {k['gave_up']} the client gave up on)" if k.get("gave_up") else ""
        rows.append(["the gateway's counters (requests / non-200)", f"{k['gateway_requests']} / {k['gateway_non_200']}",
                     f"{k['sent_to_gateway']} / {k['http_errors']}{gave_up}", _yes(k["gateway_agrees"])])
    return _table(["source", "it counted", "this report", "agree"], rows)


def _yes(v: bool | None) -> str:
    return "-" if v is None else ("<span class='good'>yes</span>" if v else "<span class='bad'>NO</span>")


def _img(charts: dict[str, Path], name: str) -> str:
    path = charts.get(name)
    if path is None:
        return ""
    data = base64.b64encode(path.read_bytes()).decode()
    return f"<img alt='{name} chart' src='data:image/png;base64,{data}'>"


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _f(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, int):
        return str(v)
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def _pct(v: float | None) -> float | None:
    return None if v is None else v * 100
