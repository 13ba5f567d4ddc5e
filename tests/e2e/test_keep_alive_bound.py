"""A function's own keep-alive bound, live: `shoal up` on emulated devices, a function whose cold
start (1 s model load) is over its SLO (200 ms), so the keep-alive's price would keep it idle up
to 30 x its `idle_to_zero_s` (1 s) with no gaps known (tests/e2e/test_idle_shrink.py: kept 30 s).
Deployed with `shoal deploy --keep-alive-max-s 3` it goes to zero 3 s after its last request,
and the decision names the bound. Deployed on 1/8, its least slice, so no move comes first."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx

from tests.conftest import ROOT, emulated_profile, start_plane, wait_for

BODY = {"inputs": [{"name": "image", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": [0.0] * 192}]}


def test_a_function_goes_to_zero_at_its_own_keep_alive_bound(tmp_path):
    plane = start_plane(tmp_path / "state", "--devices", "emulated:1x80GiB")
    profile = tmp_path / "emulated_10ms.yaml"
    profile.write_text(emulated_profile(10.0, 1024, load_s=1.0))
    try:
        out = subprocess.run([sys.executable, "-m", "deploy.cli", "deploy", str(profile), "--name", "bounded",
                              "--slice", "1/8", "--slo-ms", "200", "--max", "1", "--idle-to-zero-s", "1",
                              "--keep-alive-max-s", "3", "--url", plane.url, "--state-dir", str(plane.state_dir)],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert out.returncode == 0, out.stderr
        with plane.client() as client, httpx.Client(timeout=30) as http:
            assert client.function("bounded")["scaling"]["keep_alive_max_s"] == 3.0
            for _ in range(10):  # the first waits through the cold start (a miss: the price is set)
                assert http.post(f"{plane.url}/v2/models/bounded/infer", json=BODY).status_code == 200
            last = time.monotonic()

            def replicas():
                return client.status()["functions"].get("bounded", {}).get("replicas", [])
            wait_for(lambda: not replicas(), 20, "scale to zero", detail=lambda: client.events("bounded"))
            gone_after = time.monotonic() - last
            zero = [e for e in client.events("bounded") if e["kind"] == "scale" and e["data"]["to"] == 0]
            assert zero and zero[-1]["data"]["reason"] == "TO_ZERO", zero
            # priced (a cold start over the SLO), and held to the function's bound, not 30 s
            message = zero[-1]["message"]
            assert "keep-alive 3 s" in message and "a cold start priced at" in message, message
            assert "its keep_alive_max_s" in message, message
            assert 2.5 < gone_after < 15, gone_after
    finally:
        assert plane.stop() == 0
