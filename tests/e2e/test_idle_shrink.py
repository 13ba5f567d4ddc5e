"""A lone replica kept idle moves to its least slice, live: `shoal up` on emulated devices, a
function whose cold start (1 s model load) is over its SLO (200 ms), so the keep-alive's price
keeps it past its `idle_to_zero_s` (1 s, at most 30 x 1 = 30 s with no gaps known); once idle for
1 s it asks for the least slice a start from zero would get (autoscaler.policy._idle_shrink:
10 ms a request on 1/2 is 40 ms on 1/8, within half the 160 ms p95 target), the replica moves
there (a new one on 1/8, then the old one's slice given back), and it goes to zero after.
`max_replicas` 1: the first request's miss in the cold start adds no spare (a move is not a
scale-up, so it is not bound by it)."""

from __future__ import annotations

import httpx

from tests.conftest import emulated_profile, start_plane, wait_for

BODY = {"inputs": [{"name": "image", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": [0.0] * 192}]}


def _replicas(client, name: str) -> list[dict]:
    return client.status()["functions"].get(name, {}).get("replicas", [])


def test_a_replica_kept_idle_moves_to_the_least_slice_then_goes_to_zero(tmp_path):
    plane = start_plane(tmp_path / "state", "--devices", "emulated:1x80GiB")
    profile = tmp_path / "emulated_10ms.yaml"
    profile.write_text(emulated_profile(10.0, 1024, load_s=1.0))
    try:
        with plane.client() as client:
            client.deploy(profile, "small", slice="1/2", idle_to_zero_s=1, slo_ms=200.0, max_replicas=1)
            with httpx.Client(timeout=30) as http:
                for _ in range(20):  # the first waits through the cold start; the rest are measured
                    assert http.post(f"{plane.url}/v2/models/small/infer", json=BODY).status_code == 200
            assert [r["slice"] for r in _replicas(client, "small")] == ["1/2"]

            def moved():
                return [e for e in client.events("small") if e["kind"] == "replica_stopped"
                        and "moved to" in e["message"] and "on a 1/8 slice" in e["message"]]
            wait_for(moved, 20, "the replica moved to 1/8", detail=lambda: client.events("small"))
            wait_for(lambda: not _replicas(client, "small"), 50, "scale to zero",
                     detail=lambda: client.events("small"))
            events = client.events("small")
            ask = [e for e in events if e["kind"] == "slice" and e["data"].get("reason") == "SLICE"]
            assert ask and "idle 1 s: kept on a 0.125 slice" in ask[0]["message"], events
            ready = [e for e in events if e["kind"] == "replica_ready"]
            assert [e["message"].split(" slice ")[-1].split()[0] for e in ready] == ["1/2", "1/8"], ready
            # the ask came once idle_to_zero_s had passed, and the zero once the keep-alive had
            zero = [e for e in events if e["kind"] == "scale" and e["data"]["to"] == 0]
            assert zero and zero[-1]["data"]["reason"] == "TO_ZERO" and zero[-1]["at"] > ask[0]["at"], events
            # kept 30 s (the cap for few gaps) from its last request, the ask 1 s into it
            assert "keep-alive 30 s" in zero[-1]["message"] and zero[-1]["at"] - ask[0]["at"] > 25, zero
    finally:
        assert plane.stop() == 0
