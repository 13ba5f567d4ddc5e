"""Overload against a real `shoal up` on loopback: a burst at 10x a function's capacity
is answered 503 with Retry-After at once past the replica's bounded queue, memory stays
flat, latency is back within 10 s of the burst's end, and another function served
through the same gateway all along is not starved. (The gateway's own per-function
limit is shown deterministically in tests/integration/test_gateway.py.)"""

from __future__ import annotations

import asyncio
import json
import time

import psutil
import pytest

from tests.chaos.load import Load, summary, v2_body
from tests.chaos.test_faults import EXPLICIT, PROFILE, host_port, ready, replicas_of
from tests.conftest import emulated_profile, start_plane, wait_for

pytestmark = pytest.mark.integration

# one replica, 20 ms a request whatever the batch: a capacity of 50 requests a second
SLOW_PROFILE = emulated_profile(20.0, 1000)
CAPACITY_RPS = 50
BURST_START_S, BURST_S = 4.0, 3.0


def rss_mib(processes: list[psutil.Process]) -> float:
    total = 0
    for p in processes:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


@pytest.mark.timeout(180)
def test_a_burst_at_10x_capacity_is_shed_at_once_and_latency_recovers(tmp_path):
    profile = tmp_path / "slow.yaml"
    profile.write_text(SLOW_PROFILE)
    plane = start_plane(tmp_path / "state", "--devices", "emulated:2x80GiB")
    try:
        with plane.client() as client:
            spec = client.deploy(profile, "hot", min_replicas=1, max_replicas=1)
            # the replica's queue: 16 requests (320 ms of work) wait; past that, 503 at once
            body = {k: spec[k] for k in ("artifact", "slice", "scaling", "batching")}
            body["batching"] = {**body["batching"], "max_queue_requests": 16}
            assert client.http.put("/api/v1/functions/hot", json=body).status_code == 200
            client.deploy(PROFILE, "calm", min_replicas=1, max_replicas=1)
            wait_for(lambda: ready(client, "hot") == 1 and ready(client, "calm") == 1
                     and client.status()["functions"]["hot"]["revision"] == 2, 60, "both ready")
        processes = [psutil.Process(plane.proc.pid), *replicas_of(plane)]
        memory: list[tuple[float, float]] = []

        async def sample(load: Load, until_s: float) -> None:
            while time.monotonic() - load.t0 < until_s:
                memory.append((time.monotonic() - load.t0, rss_mib(processes)))
                await asyncio.sleep(0.2)

        async def main() -> Load:
            load = Load(*host_port(plane), v2_body("image", [1, 3, 8, 8]), timeout_s=30)
            await asyncio.gather(
                load.run("hot", rate=CAPACITY_RPS / 2, seconds=BURST_START_S),
                load.run("hot", rate=10 * CAPACITY_RPS, seconds=BURST_S, start_s=BURST_START_S),
                load.run("hot", rate=CAPACITY_RPS / 2, seconds=14, start_s=BURST_START_S + BURST_S),
                load.run("calm", rate=20, seconds=21),
                sample(load, 21),
            )
            load.close()
            return load

        load = asyncio.run(main())
    finally:
        assert plane.stop() == 0

    hot = [o for o in load.outcomes if o.function == "hot"]
    calm = [o for o in load.outcomes if o.function == "calm"]
    burst_end = BURST_START_S + BURST_S
    during = [o for o in hot if BURST_START_S <= o.sent_at < burst_end]
    shed = [o for o in hot if o.status == 503]
    # every request ended in an answer: no hang, no connection error, nothing unsent
    assert all(o.status is not None for o in load.outcomes), summary([o for o in load.outcomes if o.status is None])
    assert all(o.status == 200 or o.status in EXPLICIT for o in load.outcomes)
    # the excess was shed with 503 and Retry-After, at once rather than after queueing
    assert len(shed) > len(during) / 2 and all(o.retry_after == "1" for o in shed), summary(during)
    shed_p99 = sorted(o.latency_s for o in shed)[int(0.99 * len(shed))]
    assert shed_p99 < 0.5, shed_p99
    # latency recovers: per second after the burst, every request answered 200 and the p95
    # close to the 20 ms service time; recovered when no later second is worse (one slow
    # request on a loaded machine moves no p95)
    seconds = [[o for o in hot if burst_end + i <= o.sent_at < burst_end + i + 1] for i in range(14)]
    def p95(sec: list) -> float:
        return sorted(o.latency_s for o in sec)[int(0.95 * len(sec))]

    bad = [i for i, sec in enumerate(seconds) if not sec or any(o.status != 200 for o in sec) or p95(sec) > 0.2]
    recovered_s = float(bad[-1] + 1) if bad else 0.0
    assert recovered_s <= 10.0, [(i, summary(seconds[i])) for i in bad]
    # memory is bounded: the gateway and the replicas grow by less than 100 MiB under the burst
    before = max(m for t, m in memory if t < BURST_START_S)
    peak = max(m for _, m in memory)
    assert peak - before < 100, (before, peak)
    # the other function, through the same gateway, was served all along
    calm_summary = summary(calm)
    assert calm_summary["by"] == {"200": len(calm)} and calm_summary["p99_s"] < 1.0, calm_summary
    print("10x burst:", json.dumps({
        "hot_during_burst": summary(during), "shed_503": len(shed), "shed_p99_s": round(shed_p99, 4),
        "recovered_s": round(recovered_s, 2), "rss_before_mib": round(before, 1), "rss_peak_mib": round(peak, 1),
        "calm": calm_summary}))
