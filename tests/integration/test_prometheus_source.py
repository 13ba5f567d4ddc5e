"""Prometheus as the metrics source, for real: Debian's `prometheus` on loopback scrapes
the replicas of a local `shoal up`, and the controller's view of them through PromQL
(`autoscaler.sources.promql.PrometheusSource`) is the view it gets from scraping them
itself: the same counters, and the same decisions from `decide()` over two windows.

Skipped when /usr/bin/prometheus is missing (`apt-get install prometheus`), unless
SHOAL_REQUIRE_PROMETHEUS is set, when that is a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client import CollectorRegistry

from autoscaler.replicas import Replica, ReplicaScaler
from autoscaler.metrics import ReplicaStat
from autoscaler.placement import Inventory
from autoscaler.policy import PolicyState, ScaleDecision, decide
from autoscaler.sources.direct import HttpScraper, ReplicaScrapes
from autoscaler.sources.promql import PrometheusSource
from functions.examples.digits import digits_data
from functions.spec import ScalingSpec
from tests.conftest import start_plane, stop_process, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

PROMETHEUS = Path("/usr/bin/prometheus")
SCRAPE_INTERVAL_S = 1.0
# The spec decide() judges the two views by. The digits model costs ~0.2 ms a request, so
# the load below keeps each replica ~2 % busy with p95 ~10 ms; a 1 ms SLO and a 0.5 %
# duty target make that work call for more replicas (e.g. 0.035 busy s/s / 0.005 x 2 SLO
# boost = 14.0 -> 15), so the decision follows the metrics, not the replica bounds.
SCALING = ScalingSpec(min_replicas=1, max_replicas=64, slo_p95_ms=1.0, target_duty=0.005, target_concurrency=4.0)


@dataclass
class Prometheus:
    proc: subprocess.Popen
    url: str
    targets: Path

    def scrape(self, hostports: list[str]) -> None:
        """Point Prometheus at these targets (file_sd: written whole, then renamed into place)."""
        tmp = self.targets.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": hostports}]))
        tmp.replace(self.targets)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def prometheus(tmp_path):
    if not PROMETHEUS.exists():
        reason = f"{PROMETHEUS} is missing: apt-get install prometheus"
        if os.environ.get("SHOAL_REQUIRE_PROMETHEUS"):
            pytest.fail(f"SHOAL_REQUIRE_PROMETHEUS is set but {reason}")
        pytest.skip(reason)
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    config = tmp_path / "prometheus.yml"  # JSON is YAML
    config.write_text(json.dumps({
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S:g}s", "scrape_timeout": f"{SCRAPE_INTERVAL_S:g}s"},
        "scrape_configs": [{"job_name": "shoal-replicas",
                            "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}]}],
    }))
    port = _free_port()
    log = open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen(
        [str(PROMETHEUS), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
        stdout=log, stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is not None or _answers(f"{url}/-/ready"), 20, "Prometheus ready")
        assert proc.poll() is None, f"prometheus exited {proc.returncode}: {(tmp_path / 'prometheus.log').read_text()}"
        yield Prometheus(proc, url, targets)
    finally:
        stop_process(proc, 15, 10)
        log.close()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


# ---------------------------------------------------------------------- load


def _payload(rows: int) -> bytes:
    x = digits_data()[0][:rows]
    return json.dumps({"inputs": [{"name": "X", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.reshape(-1).tolist()}], "outputs": [{"name": "label"}]}).encode()


async def _load(url: str, payload: bytes, concurrency: int, seconds: float) -> dict[int, int]:
    """Closed-loop load: `concurrency` clients, each sending its next request when the last
    is answered, until `seconds` have passed; returns when every request is answered."""
    codes: dict[int, int] = {}
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=concurrency)) as http:
        async def client():
            while time.monotonic() < end:
                r = await http.post(f"{url}/v2/models/digits/infer", content=payload,
                                    headers={"content-type": "application/json"})
                codes[r.status_code] = codes.get(r.status_code, 0) + 1

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return codes


# ---------------------------------------------------------------------- both views at one moment


async def _read_both(prom: PrometheusSource, direct: HttpScraper, replicas: dict[str, int], after: float
                     ) -> tuple[dict[str, ReplicaStat], dict[str, ReplicaStat]]:
    """Each replica read through Prometheus and directly, at the moment Prometheus scrapes it.

    Prometheus scrapes a target every SCRAPE_INTERVAL_S at a fixed offset, so its next
    scrape after the last one it holds is predictable: the direct scrape is taken then,
    and both views carry (nearly) the same time, so rates compare over the same window,
    not over windows skewed by up to a scrape interval. Every scrape is after `after`.
    """
    async def one(replica: str, port: int) -> tuple[ReplicaStat, ReplicaStat]:
        last = await prom.scrape(replica, "127.0.0.1", port, 0.0)
        assert last is not None, f"Prometheus holds no sample of {replica}"
        due = last.at + SCRAPE_INTERVAL_S
        while due <= after:
            due += SCRAPE_INTERVAL_S
        await asyncio.sleep(max(0.0, due - time.time()))
        seen = await direct.scrape(replica, "127.0.0.1", port, time.time())
        deadline = time.monotonic() + 3 * SCRAPE_INTERVAL_S
        while True:
            stat = await prom.scrape(replica, "127.0.0.1", port, 0.0)
            if stat is not None and stat.at >= due - SCRAPE_INTERVAL_S / 2:
                return stat, seen
            assert time.monotonic() < deadline, f"Prometheus did not scrape {replica} after {due:.3f}"
            await asyncio.sleep(0.02)

    pairs = await asyncio.gather(*(one(r, p) for r, p in replicas.items()))
    return ({r: p for r, (p, _) in zip(replicas, pairs)}, {r: d for r, (_, d) in zip(replicas, pairs)})


class _Recorded:
    """A MetricsSource that answers what was read beforehand, so that two controllers see
    the two views of the same moment."""

    def __init__(self):
        self.stats: dict[str, ReplicaStat] = {}

    async def scrape(self, replica: str, host: str, port: int, at: float) -> ReplicaStat | None:
        return self.stats.get(replica)


class _IdleRouter:
    """The gateway's counts, at a moment when nothing is in flight or held."""

    def outstanding(self, function: str) -> int:
        return 0

    def inflight_seconds(self, function: str) -> tuple[float, float]:
        return 0.0, 0.0  # no integral: the reading takes the count now (outstanding)

    def held(self, function: str) -> int:
        return 0

    def __init__(self) -> None:
        self.histograms: dict = {}  # the plane's gateway latencies, read once for both views

    def latencies(self) -> dict:
        return self.histograms


async def _gateway_latencies(url: str) -> dict:
    """shoal up's gateway histogram, from its /metrics: the latencies both views read."""
    from prometheus_client.parser import text_string_to_metric_families

    from autoscaler.metrics import cumulative_histogram

    async with httpx.AsyncClient(timeout=5) as http:
        text = (await http.get(f"{url}/metrics")).text
    pairs: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "shoal_gateway_request_duration_seconds_bucket":
                pairs.setdefault(sample.labels["function"], []).append((float(sample.labels["le"]), sample.value))
    return {function: cumulative_histogram(p) for function, p in pairs.items()}


def _controller(source: _Recorded, replicas: dict[str, int]) -> ReplicaScrapes:
    router = _IdleRouter()
    scaler = ReplicaScaler(backend=None, router=router, inventory=Inventory(()), events=lambda *a, **k: None,
                           registry=CollectorRegistry())
    for replica_id, port in replicas.items():
        scaler.replicas[replica_id] = Replica(replica_id, "digits", 1, placement=None, state="ready",
                                              handle=SimpleNamespace(host="127.0.0.1", port=port))
    return ReplicaScrapes(scaler, source, router)


def _counters(stat: ReplicaStat) -> ReplicaStat:
    """Everything but the time the view was taken."""
    return replace(stat, at=0.0)


# ---------------------------------------------------------------------- the test


def test_controller_decides_the_same_from_promql_as_from_direct_scrapes(tmp_path, digits_onnx, prometheus):
    # the live controller reads through Prometheus too (`shoal up --metrics-source prometheus`)
    plane = start_plane(tmp_path / "state", "--metrics-source", "prometheus", "--prometheus-url", prometheus.url)
    try:
        with plane.client() as client:
            # min = max = 2: two warm replicas, and the live controller does not move them
            client.deploy(digits_onnx, "digits", min_replicas=2, max_replicas=2, slice="1/4")
            status = wait_for(lambda: _ready(client), 30, "two ready replicas", detail=lambda: client.events("digits"))
            replicas = {r["id"]: r["port"] for r in status["replicas"]}
            # the replicas, and shoal up's own page: the gateway's latencies, which the cluster's queries read
            prometheus.scrape([f"127.0.0.1:{port}" for port in replicas.values()] + [plane.url.split("://", 1)[1]])
            asyncio.run(_compare(plane.url, prometheus.url, replicas))
            _cluster_queries_select_the_function(prometheus.url)
            # and its own view of each replica is a rate over two Prometheus scrapes
            live = client.status()["functions"]["digits"]["replicas"]
            assert all(r["duty"] is not None for r in live), live
    finally:
        assert plane.stop() == 0


def _cluster_queries_select_the_function(prometheus_url: str) -> None:
    """The cluster controller's nine queries (autoscaler/sources/promql.py) against this real Prometheus:
    they parse, and select the function's series by its label. (Here the targets have no `pod` label,
    so duty is one series; on a cluster the ServiceMonitor adds one per pod.)"""
    from autoscaler.sources.promql import PromQL, by_function, cluster_queries, snapshot_from_results

    async def vectors() -> dict[str, list]:
        promql = PromQL(prometheus_url, timeout_s=5.0)
        try:
            return {key: await promql.vector(q) for key, q in cluster_queries().items()}
        finally:
            await promql.close()

    split = by_function(asyncio.run(vectors()))
    digits = split["digits"]
    assert {"rps", "busy", "duty", "p95_s", "inflight", "queued", "buckets", "batches"} <= set(digits), digits.keys()
    snapshot = snapshot_from_results("digits", time.time(), None, digits, slo_s=0.0001)
    assert snapshot.rps > 0 and snapshot.service_s is not None and snapshot.service_s > 0
    assert snapshot.p95_s is not None and 0 < snapshot.p95_s < 5
    assert snapshot.over_slo > 0.5  # a tenth of a millisecond: hardly any request is that fast
    assert {s["metric"]["le"] for s in digits["buckets"]} >= {"+Inf"}  # one sample per bound


def _ready(client) -> dict | None:
    function = client.status()["functions"].get("digits", {})
    ready = [r for r in function.get("replicas", []) if r["state"] == "ready" and r.get("port")]
    return function if len(ready) == 2 else None


async def _compare(url: str, prometheus_url: str, replicas: dict[str, int]) -> None:
    prom, direct = PrometheusSource(prometheus_url), HttpScraper()
    from_prom, from_direct = _Recorded(), _Recorded()
    controllers = {"promql": _controller(from_prom, replicas), "direct": _controller(from_direct, replicas)}
    states = {name: PolicyState() for name in controllers}
    try:
        # Prometheus applies new file_sd targets within a reload period (5 s in 2.42)
        deadline = time.monotonic() + 20
        while not all(await asyncio.gather(*(prom.scrape(r, "127.0.0.1", p, 0.0) for r, p in replicas.items()))):
            assert time.monotonic() < deadline, "Prometheus did not scrape the replicas in 20 s"
            await asyncio.sleep(0.1)
        payload = _payload(500)
        decisions: list[dict[str, ScaleDecision]] = []
        # three quiet moments around two loads: two windows with work in them
        for concurrency in (0, 4, 12):
            if concurrency:
                codes = await _load(url, payload, concurrency, seconds=3.0)
                assert set(codes) == {200}, codes
            from_prom.stats, from_direct.stats = await _read_both(prom, direct, replicas, after=time.time())
            for replica in replicas:
                assert _counters(from_prom.stats[replica]) == _counters(from_direct.stats[replica]), replica
            histograms = await _gateway_latencies(url)
            for c in controllers.values():
                c.latencies.histograms = histograms
            now = time.monotonic()
            snapshots = {name: await c.snapshot("digits", now) for name, c in controllers.items()}
            decided = {}
            for name, snapshot in snapshots.items():
                decided[name], states[name] = decide(snapshot, SCALING, states[name], now)
            decisions.append(decided)
            # the need each view recorded for this window (the burst window may carry an earlier one)
            assert states["promql"].needs[-1].replicas == pytest.approx(states["direct"].needs[-1].replicas, rel=0.02)
            if concurrency:
                _assert_same_window(snapshots["promql"], snapshots["direct"])
            assert (decided["promql"].desired, decided["promql"].reason) == \
                   (decided["direct"].desired, decided["direct"].reason), (concurrency, decided, snapshots)
        assert decisions[0]["promql"].reason == "NO_DATA"  # one scrape each: no window yet
        assert decisions[1]["promql"].desired > 2, decisions  # the first window's work scales up
    finally:
        await prom.close()
        await direct.close()


def _assert_same_window(promql, direct) -> None:
    """Load happened in the window, and both views measured it alike: the counters are equal
    (asserted above), so rates differ only by the two views' times, a few ms over seconds."""
    assert promql.rps > 0 and direct.rps > 0 and sum(promql.duty) > 0, (promql, direct)
    assert promql.rps == pytest.approx(direct.rps, rel=0.02)
    assert promql.duty == pytest.approx(direct.duty, rel=0.02, abs=1e-3)
    assert promql.p95_s == direct.p95_s and promql.service_s == pytest.approx(direct.service_s)
