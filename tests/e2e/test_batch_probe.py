"""The batch probe, live: `shoal up` on an emulated device, functions/examples/emulated_code.yaml
(40 ms at 1 row, 120 ms at 8: slept) deployed with batches of 8. Its replica times a batch of 1
and one of 8 rows of zeros at load and exports them; one request at a time never forms a batch,
yet the controller reads two sizes (GET /api/v1/status's batch_latency_s, the table the policy is
given), so full_batch reads a model that batches."""

from __future__ import annotations

import subprocess
import sys

import httpx

from autoscaler.metrics import parse_replica_metrics
from tests.conftest import ROOT, start_plane, wait_for

BODY = {"inputs": [{"name": "tokens", "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}]}


def test_a_replica_probes_its_batches_and_the_controller_reads_both_sizes(tmp_path):
    plane = start_plane(tmp_path / "state", "--devices", "emulated:1x80GiB")
    try:
        out = subprocess.run([sys.executable, "-m", "deploy.cli", "deploy", str(ROOT / "functions/examples/emulated_code.yaml"),
                              "--name", "code", "--slice", "1/4", "--slo-ms", "200", "--batch", "8", "--min", "1",
                              "--url", plane.url, "--state-dir", str(plane.state_dir)],
                             capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert out.returncode == 0, out.stderr
        with plane.client() as client, httpx.Client(timeout=30) as http:
            def function():
                return client.status()["functions"].get("code", {})

            wait_for(lambda: function().get("ready", 0) >= 1, 60, "a replica ready",
                     detail=lambda: client.events("code"))
            for _ in range(5):  # one at a time: every batch holds one request
                assert http.post(f"{plane.url}/v2/models/code/infer", json=BODY).status_code == 200
            port = function()["replicas"][0]["port"]
            page = http.get(f"http://127.0.0.1:{port}/metrics").text
            probe = dict(parse_replica_metrics(page, "code-1", 0.0).probe)
            assert set(probe) == {1.0, 8.0}, page
            # slept 40 and 120 ms, and the serving stack's few ms beside
            assert 0.040 <= probe[1.0] < 0.070 and 0.120 <= probe[8.0] < 0.150, probe
            wait_for(lambda: [8.0, probe[8.0]] in function().get("batch_latency_s", []), 15, "the probe's 8 read",
                     detail=function)
            # batch 1 from the requests (or the probe; a window whose scrape caught the request
            # counter a request ahead of the batch counter may read 2 a batch), batch 8 from the
            # probe alone: no window ran one
            table = function()["batch_latency_s"]
            assert table[0][0] < 2.5 and 0.040 <= table[0][1] < 0.070 and table[-1] == [8.0, probe[8.0]], table
    finally:
        assert plane.stop() == 0
