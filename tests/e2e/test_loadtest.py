"""`shoal loadtest` end to end: a real `shoal up`, a real Locust process, a report whose numbers
agree with Locust's CSV and with the control plane's own counters; the report rendered in
headless Chromium with no console error."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

import httpx
import numpy as np
import pytest

from tests.conftest import ROOT, start_plane, wait_for

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)


def _metrics(url: str) -> dict:
    from loadtests.analysis import counter_totals

    return counter_totals(httpx.get(f"{url}/metrics", timeout=10).text)


def _gateway_requests(m: dict, function: str) -> dict[str, float]:
    return {dict(k)["code"]: v for k, v in m["shoal_gateway_requests_total"].items() if dict(k)["function"] == function}


def _loadtest(plane, out, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "deploy.cli", "loadtest", *args, "--url", plane.url,
           "--state-dir", str(plane.state_dir), "--out", str(out), "--quiet"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, digits_onnx):
    """Two runs on one `shoal up`: a spike into digits at zero, then a zero cycle compared with it."""
    tmp = tmp_path_factory.mktemp("loadtest")
    plane = start_plane(tmp / "state")
    try:
        with plane.client() as client:
            client.deploy(digits_onnx, "digits", slice="1/4", max_replicas=3, idle_to_zero_s=2,
                          target_concurrency=2, batch=8, batch_delay_ms=1)
            assert httpx.get(f"{plane.url}/v2/models/digits", timeout=60).status_code == 200  # metadata, cached
            wait_for(lambda: client.status()["functions"]["digits"]["ready"] == 0, 30, "digits at zero")
            before_metrics = _metrics(plane.url)
            before_cold = client.status()["functions"]["digits"]["cold_starts"]
            first_event = client.events(limit=1)[-1]["id"]

            spike = _loadtest(plane, tmp / "spike", "spike", "--function", "digits", "--rate", "40", "--duration", "10",
                              "--base-rate", "0", "--spike-at", "2", "--spike-s", "5", "--from-zero", "--seed", "3")
            after_metrics = _metrics(plane.url)
            after_cold = client.status()["functions"]["digits"]["cold_starts"]
            ready_events = [e for e in client.events("digits", after=first_event) if e["kind"] == "replica_ready"]

            cycle = _loadtest(plane, tmp / "cycle", "zero-cycle", "--function", "digits", "--rate", "30",
                              "--duration", "12", "--burst-s", "3", "--idle-s", "6", "--encoding", "binary",
                              "--compare", str(tmp / "spike"), "--title", "zero cycle, binary tensors")
    finally:
        assert plane.stop() == 0
    assert spike.returncode == 0, spike.stderr + spike.stdout
    assert cycle.returncode == 0, cycle.stderr + cycle.stdout
    return {"spike": tmp / "spike", "cycle": tmp / "cycle", "stdout": spike.stdout,
            "gateway": {code: v - _gateway_requests(before_metrics, "digits").get(code, 0.0)
                        for code, v in _gateway_requests(after_metrics, "digits").items()},
            "cold_starts": after_cold - before_cold, "ready_events": ready_events}


def test_report_numbers_agree_with_locust_and_the_control_plane(runs):
    out = runs["spike"]
    summary = json.loads((out / "summary.json").read_text())
    # Locust's own totals, read here independently
    aggregated = next(r for r in csv.DictReader(open(out / "locust_stats.csv")) if r["Name"] == "Aggregated")
    assert summary["requests"] == int(aggregated["Request Count"]) > 100  # 40/s for 5 s: about 200
    assert summary["failures"] == int(aggregated["Failure Count"]) == 0
    rows = list(csv.DictReader(open(out / "requests.csv")))
    assert len(rows) == summary["requests"]
    # the gateway's counter, read by this test: the runner's requests plus its one metadata GET
    assert runs["gateway"] == {"200": summary["requests"] + 1}
    assert summary["checks"]["gateway_requests"] == summary["requests"]
    assert summary["checks"]["locust_agrees"] and summary["checks"]["gateway_agrees"]
    # cold starts: the control plane's counter and its replica_ready events
    assert summary["cold_starts"]["count"] == runs["cold_starts"] >= 1  # it started from zero
    assert len(summary["cold_starts"]["replica_starts"]) == len(runs["ready_events"]) >= 1
    assert summary["cold_starts"]["requests_held"] >= 1
    # latency and SLO recomputed from the per-request rows
    latency = np.array([float(r["latency_ms"]) for r in rows])
    assert summary["latency_ms"]["p95"] == pytest.approx(np.percentile(latency, 95))
    assert summary["slo_attainment"] == pytest.approx(np.mean(latency <= 100.0))  # digits' SLO is 100 ms
    assert summary["offered"] == summary["requests"]  # open loop, nothing refused by the client
    # decisions with reasons; costs against the static peak
    reasons = [d["reason"] for d in summary["scale_decisions"] if d["kind"] == "scale"]
    assert reasons[0] == "COLD_START" and "TO_ZERO" in reasons
    cost = summary["cost"]
    assert 0 < cost["replica_slice_seconds"] < cost["static_peak"]["replica_slice_seconds"]
    assert cost["device_kinds"] == ["cpu"] and cost["gpu_seconds"] is None
    assert "report: " in runs["stdout"] and "SLO attainment" in runs["stdout"]


def test_report_files_and_headline(runs):
    out = runs["spike"]
    summary = json.loads((out / "summary.json").read_text())
    for name in ("latency", "throughput", "replicas", "duty", "coldstarts"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    page = (out / "report.html").read_text()
    assert f"{summary['slo_attainment'] * 100:.2f}%" in page
    assert f"{summary['cost']['vs_static']:.2f}×" in page
    assert "COLD_START" in page and "TO_ZERO" in page
    assert "http://" not in page.replace(summary["url"], "")  # nothing fetched from anywhere
    assert page.count("src='data:image/png;base64,") == 5


def test_compare_puts_two_runs_side_by_side(runs):
    out = runs["cycle"]
    summary = json.loads((out / "summary.json").read_text())
    page = (out / "report.html").read_text()
    assert "Side by side" in page and (out / "compare.png").exists()
    assert "zero cycle, binary tensors" in page and "spike on digits" in page
    # two bursts with an idle gap past idle_to_zero_s: two cold starts, and binary tensors worked
    assert summary["failures"] == 0 and summary["params"]["encoding"] == "binary"
    assert len(summary["cold_starts"]["replica_starts"]) >= 2


def test_report_renders_in_headless_chromium(runs, tmp_path):
    if CHROMIUM is None:
        if os.environ.get("SHOAL_REQUIRE_BROWSER"):
            pytest.fail("SHOAL_REQUIRE_BROWSER is set but Debian's chromium is not installed")
        pytest.skip("chromium not installed (apt-get install chromium; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    shot = tmp_path / "report.png"
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            page.goto((runs["cycle"] / "report.html").as_uri(), wait_until="load")
            images = page.eval_on_selector_all("img", "els => els.map(e => [e.alt, e.complete, e.naturalWidth])")
            headline = page.inner_text(".headline")
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert len(images) >= 6 and all(done and width >= 800 for _, done, width in images), images
    assert "SLO ATTAINMENT" in headline.upper() and "WORST COLD START" in headline.upper()
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
