"""Shoal's policy driving a real `shoal up` on emulated devices: a step in load scales the
function out, with the reason in `shoal events`; idle brings it back to zero."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.conftest import emulated_profile, start_plane, wait_for

BODY = {"inputs": [{"name": "image", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": [0.0] * 192}]}


async def _closed_loop(url: str, users: int, seconds: float) -> dict[int, int]:
    """`users` clients each sending one request after another for `seconds`."""
    codes: dict[int, int] = {}
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=users)) as http:
        async def user():
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                r = await http.post(f"{url}/v2/models/resnet/infer", json=BODY)
                codes[r.status_code] = codes.get(r.status_code, 0) + 1

        await asyncio.gather(*(user() for _ in range(users)))
    return codes


def _replicas(client, name: str) -> list[dict]:
    return client.status()["functions"].get(name, {}).get("replicas", [])


# The emulated resnet's input and output, 40 ms per request: slow enough that 24 users keep
# 24 requests in flight at the gateway even when this machine is busy and the load generator
# gets little CPU (with the 4 ms of functions/examples/emulated_resnet.yaml, a starved client
# kept only a few in flight and the step did not read as one: seen with three CPU burners).
PROFILE = emulated_profile(40.0, 1500, load_s=0.05)


def test_step_scales_out_then_idle_scales_to_zero_on_emulated_devices(tmp_path):
    plane = start_plane(tmp_path / "state", "--devices", "emulated:2x80GiB")
    profile = tmp_path / "emulated_resnet_40ms.yaml"
    profile.write_text(PROFILE)
    try:
        with plane.client() as client:
            # target 2 in flight per replica; an SLO of 400 ms that the one-user phase meets
            # on a busy machine too
            client.deploy(profile, "resnet", slice="1/8", idle_to_zero_s=3, target_concurrency=2, max_replicas=6,
                          slo_ms=400.0)
            low = asyncio.run(_closed_loop(plane.url, users=1, seconds=2.0))
            assert set(low) == {200}, low
            before = len(_replicas(client, "resnet"))
            # one user needs one replica; a loaded machine once saw a forecast add a second during
            # the cold start. The step below must still add more.
            assert 1 <= before <= 2, [e["message"] for e in client.events("resnet")]
            # the step: 24 users at once need ceil(24 / 2) = 12 replicas, capped at max_replicas = 6
            high = asyncio.run(_closed_loop(plane.url, users=24, seconds=4.0))
            assert set(high) == {200}, high  # nothing failed while it scaled
            wait_for(lambda: len(_replicas(client, "resnet")) >= max(3, before + 1), 10, "scale-out",
                     detail=lambda: client.events("resnet"))
            ups = [e for e in client.events("resnet") if e["kind"] == "scale" and e["data"]["to"] > e["data"]["from"] >= 1]
            assert ups and all(e["data"]["reason"] in ("BURST", "SLO", "FORECAST") for e in ups), ups
            assert all(r["emulated"] and r["device"].startswith("emulated:") for r in _replicas(client, "resnet"))
            # idle_to_zero_s = 3: nothing in flight, so back to zero, with the reason
            wait_for(lambda: not _replicas(client, "resnet"), 30, "scale to zero",
                     detail=lambda: client.events("resnet"))
            downs = [e for e in client.events("resnet") if e["kind"] == "scale" and e["data"]["to"] == 0]
            assert downs and downs[-1]["data"]["reason"] == "TO_ZERO", downs
    finally:
        assert plane.stop() == 0
