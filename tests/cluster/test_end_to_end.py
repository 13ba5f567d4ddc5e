"""Issue 21, must-show 4: the whole path end to end against the real API server, scheduler and
controllers, with a real Prometheus.

`shoal controller` and `shoal gateway` run as local processes on 127.0.0.1, each with its rendered
ServiceAccount's own token (as in test_rbac.py), not as pods: no kube-proxy or DNS runs here, so
a gateway pod could reach the controller only by its pod IP, and the gateway's --controller-url
(the poke and the /api proxy) must be a fixed URL before it starts. On the host the controller is
at 127.0.0.1:PORT, and the gateway reaches the replicas at their EndpointSlices' pod IPs on the
bridge up.sh made (the host holds the bridge's gateway address), exactly as it does in a cluster.

The model is the real digits ONNX (functions/examples/digits.py). `shoal deploy` uploads it
through the gateway's /api proxy to the controller, whose --artifacts-dir is the directory the
node agent maps the `shoal-artifacts` PVC to (a PV with a claimRef binds the claim), so the
replica pod reads the very file the upload wrote.

Prometheus (Debian's `prometheus`, /usr/bin/prometheus) scrapes the replica pods' /metrics at
1 s through a file_sd file that this test rewrites from the pods' IPs (the `pod` label a
PodMonitor would add), and the gateway's /metrics; the controller's PromQL reads it. The burst
that scales out runs after the first replica is Ready, so no request is held and the scale-out
comes from what Prometheus measured, not from a poke.

Steps, each with a deadline: deploy (ConfigMap, Deployment at 0, Service); the first request is
held, the gateway pokes, the controller scales the Deployment, the scheduler binds, the node agent
runs `shoal replica`, the EndpointSlice shows it ready and the held request gets 200 with its
`Shoal-Cold-Start` phases; a burst of concurrent requests scales out to >= 2 Ready pods; idle
returns to 0 pods; `shoal rm` removes the Deployment and Service, leaves of the ConfigMap a marker
of its last revision and no replica process; deployed again (the next revision) with
`--initial 1`, the controller starts a pod with no request
(reason INITIAL), the first request finds it ready (no hold, no poke) and idle it goes to 0.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import pod_ready
from roles import Role, controller_args, free_port, sa_kubeconfig, shoal_namespace, wait_for
from test_render_apply import artifacts_storage

from deploy.cluster.configmaps import FUNCTION_KIND_LABEL
from deploy.cluster.manifests.render import FUNCTION_LABEL, REPLICA_PORT

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
NS = f"shoal-e2e-{secrets.token_hex(3)}"
FN = f"digits{secrets.token_hex(2)}"  # its own name: the replica processes are found by it
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
BODY = {"inputs": [{"name": "X", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
IDLE_TO_ZERO_S = 8
# a pod's cold start (seconds) within the SLO, so the keep-alive is the spec's 8 s: one over it is
# priced and keeps the function up to 30 x 8 s while its idle gaps are few (docs/design/policy.md)
SLO_MS = 30000


class Prometheus:
    """A real Prometheus on 127.0.0.1: 1 s scrapes of the gateway and of the targets in a file_sd
    file that `set_targets` rewrites."""

    def __init__(self, d: Path, gateway_port: int):
        d.mkdir(parents=True, exist_ok=True)
        self.targets = d / "targets.json"
        self.set_targets({})
        self.port = free_port()
        (d / "prometheus.yml").write_text(json.dumps({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": "replicas", "file_sd_configs": [{"files": [str(self.targets)], "refresh_interval": "1s"}]},
                {"job_name": "gateway", "static_configs": [{"targets": [f"127.0.0.1:{gateway_port}"]}]}]}))
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(d / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def set_targets(self, pods: dict[str, str]) -> None:
        """pods: name -> IP; written atomically (Prometheus re-reads the file on change)."""
        groups = [{"targets": [f"{ip}:{REPLICA_PORT}"], "labels": {"pod": name, "namespace": NS}}
                  for name, ip in sorted(pods.items())]
        tmp = self.targets.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, self.targets)

    def query(self, promql: str) -> list:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5)
        r.raise_for_status()
        return r.json()["data"]["result"]

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()


class PodWatcher(threading.Thread):
    """Every 0.5 s: the function's pods (name -> IP of those running) into Prometheus' targets,
    and the most Ready pods seen at once."""

    def __init__(self, cluster, prom: Prometheus):
        super().__init__(daemon=True)
        self.cluster, self.prom, self.stop = cluster, prom, threading.Event()
        self.max_ready = 0

    def pods(self) -> list[dict]:
        data = self.cluster.get(f"/api/v1/namespaces/{NS}/pods", query=[("labelSelector", f"{FUNCTION_LABEL}={FN}")])
        return (data or {}).get("items", [])

    def run(self) -> None:
        last = None
        while not self.stop.is_set():
            try:
                pods = self.pods()
                self.max_ready = max(self.max_ready, sum(pod_ready(p) for p in pods))
                targets = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods
                           if p.get("status", {}).get("podIP") and not p["metadata"].get("deletionTimestamp")}
                if targets != last:
                    self.prom.set_targets(targets)
                    last = targets
            except Exception:  # noqa: BLE001 - the next round retries
                pass
            self.stop.wait(0.5)


class Relay:
    """The gateway's --controller-url: a loopback relay to the controller that records each request's
    method and path, so the test sees the gateway's poke (POST /poke?function=...&held=N) itself."""

    def __init__(self, target: str):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        relay = self
        self.seen: list[tuple[float, str, str]] = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                relay.seen.append((time.time(), self.command, self.path))
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():  # the /api proxy streams
                    parts = []
                    while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                    self.rfile.readline()
                    body = b"".join(parts)
                else:
                    n = int(self.headers.get("Content-Length") or 0)
                    body = self.rfile.read(n) if n else b""
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection", "content-length", "transfer-encoding")}
                try:
                    r = httpx.request(self.command, target + self.path, headers=headers, content=body, timeout=60)
                    status, out, rh = r.status_code, r.content, r.headers
                except httpx.HTTPError as exc:
                    status, out, rh = 502, repr(exc).encode(), {}
                self.send_response(status)
                for k, v in rh.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PUT = do_DELETE = _forward  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def pokes(self) -> list[tuple[float, str]]:
        return [(t, path) for t, method, path in self.seen if method == "POST" and path.startswith("/poke")]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def shoal(*args: str, url: str, token: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args, "--url", url, "--token", token],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


def replica_processes() -> list[int]:
    """Processes whose command line runs this test's function (`shoal replica ... --name FN`)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"replica" in argv and FN.encode() in argv:
            out.append(int(p.name))
    return out


def test_deploy_cold_start_burst_idle_and_rm(cluster, tmp_path, digits_onnx):
    t_start = time.monotonic()
    timings: dict[str, float] = {}
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.fail(f"no Prometheus at {PROMETHEUS}: up.sh installs Debian's `prometheus`")
    shoal_namespace(cluster, NS)
    artifacts = cluster.dir / "artifacts"  # the node agent's directory behind the shoal-artifacts PVC
    pv = artifacts_storage(cluster, NS)
    cluster.wait("the artifacts PVC bound", lambda: (cluster.get(
        f"/api/v1/namespaces/{NS}/persistentvolumeclaims/shoal-artifacts") or {}).get("status", {}).get("phase")
        == "Bound", timeout_s=30)

    ctl_token = sa_kubeconfig(cluster, NS, "shoal-controller", tmp_path / "controller.kubeconfig")
    gw_token = sa_kubeconfig(cluster, NS, "shoal-gateway", tmp_path / "gateway.kubeconfig")
    api_token = secrets.token_hex(16)
    (tmp_path / "api-token").write_text(api_token)
    cport, gport = free_port(), free_port()
    prom = Prometheus(tmp_path / "prometheus", gport)
    watcher = PodWatcher(cluster, prom)
    relay = Relay(f"http://127.0.0.1:{cport}")
    ctl = Role("controller", controller_args(NS, cport, prom.url, tmp_path / "api-token", artifacts),
               ctl_token, tmp_path / "controller.log", identity="e2e-controller")
    gw = Role("gateway", ["--namespace", NS, "--host", "127.0.0.1", "--port", str(gport),
                          "--controller-url", relay.url, "--sync-s", "0.5"],
              gw_token, tmp_path / "gateway.log")
    gateway = f"http://127.0.0.1:{gport}"
    dep_path = f"/apis/apps/v1/namespaces/{NS}/deployments/fn-{FN}"
    svc_path = f"/api/v1/namespaces/{NS}/services/fn-{FN}"
    passed = False
    try:
        watcher.start()
        wait_for("Prometheus ready", prom.ready, 60, 0.5)
        wait_for("the controller leads (/readyz)", lambda: _status(f"http://127.0.0.1:{cport}/readyz") == 200, 30)
        wait_for("the gateway answers", lambda: _status(f"{gateway}/v2/health/ready") == 200, 30)

        # 1. shoal deploy through the gateway: ConfigMap, Deployment at 0, Service
        t0 = time.monotonic()
        out = shoal("deploy", str(digits_onnx), "--name", FN, "--max", "3", "--idle-to-zero-s", str(IDLE_TO_ZERO_S),
                    "--slo-ms", str(SLO_MS),
                    "--target-concurrency", "1", url=gateway, token=api_token)
        assert out.returncode == 0, out.stderr + out.stdout
        cms = cluster.get(f"/api/v1/namespaces/{NS}/configmaps", query=[("labelSelector", FUNCTION_KIND_LABEL)])
        assert [c["metadata"]["labels"][FUNCTION_LABEL] for c in cms["items"]] == [FN]
        dep = cluster.wait("the Deployment", lambda: cluster.get(dep_path), timeout_s=30)
        assert dep["spec"]["replicas"] == 0
        cluster.wait("the Service", lambda: cluster.get(svc_path), timeout_s=30)
        uploaded = list(artifacts.rglob("*.onnx"))
        assert uploaded and any(f.read_bytes() == digits_onnx.read_bytes() for f in uploaded), uploaded
        timings["deploy_s"] = time.monotonic() - t0
        wait_for("the gateway knows the function", lambda: FN in _models(gateway), 20)
        time.sleep(3)  # still at zero a few ticks after the deploy: nothing scales it but a request
        assert cluster.get(dep_path)["spec"]["replicas"] == 0
        assert watcher.pods() == []

        # 2. the first request is held; poke, scale, bind, run, EndpointSlice; 200 with its phases
        t0, t0_wall = time.monotonic(), time.time()
        with httpx.Client(timeout=60) as client:
            r = client.post(f"{gateway}/v2/models/{FN}/infer", json=BODY)
        timings["cold_request_s"] = time.monotonic() - t0
        assert r.status_code == 200, r.text
        assert len(r.json()["outputs"][0]["data"]) >= 1
        cold = r.headers.get("shoal-cold-start")
        assert cold, dict(r.headers)
        phases = dict(p.split("=", 1) for p in cold.replace(";", ",").split(",") if "=" in p)
        timings["cold_header"] = cold  # type: ignore[assignment]
        assert phases, cold
        pods = watcher.pods()
        assert len(pods) == 1 and pod_ready(pods[0]), [p["metadata"]["name"] for p in pods]
        pod = pods[0]
        assert pod["spec"]["nodeName"] and pod["spec"].get("schedulerName") == "hami-scheduler"
        assert _ready_ips(cluster) == {pod["status"]["podIP"]}
        assert len(replica_processes()) >= 1
        # the gateway poked the controller for the held request, and the controller then scaled
        pokes = [(t, path) for t, path in relay.pokes() if t >= t0_wall and f"function={FN}" in path]
        assert pokes and "held=1" in pokes[0][1], relay.seen[-10:]
        scale_at = _scale_patches(cluster, ctl_token.username, f"fn-{FN}")
        ups = [t for t in scale_at if t >= t0_wall]
        assert ups, scale_at
        timings["cold_phases_s"] = _cold_phases(cluster, pod, t0_wall, pokes[0][0], ups[0],  # type: ignore[assignment]
                                                 prom, r.headers.get("shoal-cold-start"))

        # 3. a burst: concurrent requests until >= 2 pods are Ready (the scale-out from Prometheus)
        t0 = time.monotonic()
        stop, counts, errors = threading.Event(), [0], []

        def client_loop() -> None:
            with httpx.Client(timeout=30) as c:
                while not stop.is_set():
                    try:
                        resp = c.post(f"{gateway}/v2/models/{FN}/infer", json=BODY)
                        counts[0] += 1
                        if resp.status_code != 200:
                            errors.append(resp.status_code)
                    except httpx.HTTPError as exc:
                        errors.append(repr(exc))

        threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(8)]
        for th in threads:
            th.start()
        try:
            cluster.wait(">= 2 Ready pods under the burst",
                         lambda: sum(pod_ready(p) for p in watcher.pods()) >= 2 or None, timeout_s=90, every_s=0.5)
            timings["burst_to_2_ready_s"] = time.monotonic() - t0
            time.sleep(3)  # both serve
        finally:
            stop.set()
            for th in threads:
                th.join(35)
        timings["burst_requests"] = counts[0]
        assert not errors, errors[:10]
        # Prometheus saw the load (the controller's input), from the pods' own /metrics
        rps = prom.query(f'sum by (function) (rate(shoal_replica_requests_total{{function="{FN}"}}[30s]))')
        assert rps and float(rps[0]["value"][1]) > 0, rps
        load = prom.query(f'max(max_over_time(shoal_replica_model_load_seconds{{function="{FN}"}}[5m]))')
        timings["model_load_s"] = round(float(load[0]["value"][1]), 4) if load else None
        scaled = [line for line in ctl.text().splitlines() if FN in line and "scale" in line.lower()]
        print("\ncontroller scale events:\n" + "\n".join(scaled[-10:]))
        # the scale-out came from what Prometheus measured, not from held requests (a poke's COLD_START)
        outs = [m for line in scaled if (m := re.search(rf"scale {FN}: 1 -> (\d+) replicas: (\w+)", line))]
        assert outs and outs[0].group(2) != "COLD_START", scaled
        timings["scale_out_reason"] = outs[0].group(2)  # type: ignore[assignment]

        # 4. idle: back to zero pods
        t0 = time.monotonic()
        cluster.wait("back to 0 replicas and no pod", lambda: cluster.get(dep_path)["spec"]["replicas"] == 0
                     and not watcher.pods(), timeout_s=120, every_s=1)
        timings["idle_to_zero_s"] = time.monotonic() - t0
        wait_for("no replica process", lambda: not replica_processes(), 30, 0.5)

        # 5. shoal rm removes all it made but the marker of the function's last revision
        out = shoal("rm", FN, url=gateway, token=api_token)
        assert out.returncode == 0, out.stderr + out.stdout
        cluster.wait("the function's ConfigMap, Deployment and Service gone", lambda: cluster.get(dep_path) is None
                     and cluster.get(svc_path) is None
                     and not cluster.get(f"/api/v1/namespaces/{NS}/configmaps",
                                         query=[("labelSelector", FUNCTION_KIND_LABEL)])["items"], timeout_s=30)
        assert not watcher.pods() and not replica_processes()
        # what rm leaves of the ConfigMap: its last revision, in no listing of functions
        left = cluster.get(f"/api/v1/namespaces/{NS}/configmaps/function-{FN}")
        assert left["metadata"]["labels"]["shoal.dev/kind"] == "function-removed", left
        last = int(left["data"]["revision"])
        wait_for("the gateway forgets it", lambda: FN not in _models(gateway), 20)

        # 6. deployed again with one initial replica (Knative's initial-scale): the controller
        # scales the Deployment to 1 with no request; the first request finds it ready (no hold,
        # no poke); idle, it goes to zero as any replica does
        t0, t0_wall = time.monotonic(), time.time()
        out = shoal("deploy", str(digits_onnx), "--name", FN, "--max", "3", "--idle-to-zero-s", str(IDLE_TO_ZERO_S),
                    "--slo-ms", str(SLO_MS),
                    "--target-concurrency", "1", "--initial", "1", url=gateway, token=api_token)
        assert out.returncode == 0, out.stderr + out.stdout
        cluster.wait("a Ready pod with no request", lambda: cluster.get(dep_path) is not None
                     and cluster.get(dep_path)["spec"]["replicas"] == 1
                     and any(pod_ready(p) for p in watcher.pods()), timeout_s=60, every_s=0.5)
        timings["initial_ready_s"] = time.monotonic() - t0
        # the next revision, not 1 again: a Deployment of the old one would not be rolled
        assert cluster.get(dep_path)["metadata"]["labels"]["shoal.dev/revision"] == str(last + 1)
        assert not [p for t, p in relay.pokes() if t >= t0_wall and f"function={FN}" in p], relay.seen[-10:]
        raised = [line for line in ctl.text().splitlines() if FN in line and "0 -> 1 replicas: INITIAL" in line]
        assert raised, ctl.text()[-3000:]
        wait_for("the gateway knows it", lambda: FN in _models(gateway), 20)
        ip = next(p["status"]["podIP"] for p in watcher.pods() if pod_ready(p))
        cluster.wait("the EndpointSlice lists the pod ready", lambda: ip in _ready_ips(cluster), timeout_s=30,
                     every_s=0.5)
        time.sleep(1.5)  # the gateway's EndpointSlice sync (--sync-s 0.5) has seen it
        with httpx.Client(timeout=60) as client:
            r = client.post(f"{gateway}/v2/models/{FN}/infer", json=BODY)
        assert r.status_code == 200, r.text
        assert r.headers.get("shoal-cold-start") is None, dict(r.headers)  # served warm: nothing held
        assert not [p for t, p in relay.pokes() if t >= t0_wall and f"function={FN}" in p], relay.seen[-10:]
        cluster.wait("the initial replica idles to 0", lambda: cluster.get(dep_path)["spec"]["replicas"] == 0
                     and not watcher.pods(), timeout_s=120, every_s=1)
        timings["initial_to_zero_s"] = time.monotonic() - t0
        out = shoal("rm", FN, url=gateway, token=api_token)
        assert out.returncode == 0, out.stderr + out.stdout
        cluster.wait("the Deployment gone", lambda: cluster.get(dep_path) is None, timeout_s=30)
        wait_for("no replica process", lambda: not replica_processes(), 30, 0.5)
        assert ctl.alive() and gw.alive()
        passed = True
    finally:
        watcher.stop.set()
        ctl.kill(15)
        gw.kill(15)
        prom.close()
        relay.close()
        if not passed:
            for name, log in (("controller", ctl.text()), ("gateway", gw.text())):
                print(f"\n--- {name} log (tail) ---\n{log[-4000:]}")
        cluster.kubectl_run("delete", "namespace", NS, "--wait=false", check=False)
        cluster.kubectl_run("delete", "pv", pv["metadata"]["name"], "--wait=false", check=False)
    for name, text in (("controller", ctl.text()), ("gateway", gw.text())):
        assert "Traceback" not in text, f"{name} log:\n{text[-3000:]}"
    timings["total_s"] = time.monotonic() - t_start
    print(f"\nend to end: {json.dumps(timings, default=str)}")
    assert timings["total_s"] < 240


def _ready_ips(cluster) -> set[str]:
    """The addresses the function's EndpointSlices list as ready (what the gateway routes to)."""
    slices = cluster.get(f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices",
                         query=[("labelSelector", f"kubernetes.io/service-name=fn-{FN}")]) or {"items": []}
    return {a for s in slices["items"] for e in s.get("endpoints") or [] if (e.get("conditions") or {}).get("ready")
            for a in e["addresses"]}


def _scale_patches(cluster, username: str, name: str) -> list[float]:
    """When (epoch s, ms resolution) the controller patched `name`'s scale, from the audit log."""
    from roles import audit_events

    return [r.time for r in audit_events(cluster, username)
            if r.resource == "deployments/scale" and r.verb == "patch" and r.name == name and r.code == 200]


def _ts(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _cold_phases(cluster, pod: dict, request_at: float, poke_at: float, scale_at: float, prom, header) -> dict:
    """The cold start, phase by phase, from what the cluster recorded: the gateway's poke (relay,
    ms), the scale patch (audit log, ms), the pod's creation, binding, container start and Ready
    (the API's timestamps: whole seconds). Checks their order (to the API's second)."""
    pod = cluster.get(f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}") or pod
    conds = {c["type"]: _ts(c["lastTransitionTime"]) for c in pod["status"].get("conditions", [])}
    started = _ts(pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])
    created = _ts(pod["metadata"]["creationTimestamp"])
    assert request_at <= poke_at <= scale_at, (request_at, poke_at, scale_at)
    assert int(scale_at) <= created <= conds["PodScheduled"] <= started <= conds["Ready"], (scale_at, created, conds)
    whole = int(request_at)  # the API's times, as whole seconds from the request's own second
    return {"poke": round(poke_at - request_at, 3), "scale_patch": round(scale_at - request_at, 3),
            "pod_created_whole_s": int(created) - whole, "bound_whole_s": int(conds["PodScheduled"]) - whole,
            "container_started_whole_s": int(started) - whole, "ready_whole_s": int(conds["Ready"]) - whole,
            "header": header}


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0


def _models(gateway: str) -> list[str]:
    try:
        return httpx.get(f"{gateway}/v1/models", timeout=2).json()["models"]
    except (httpx.HTTPError, ValueError, KeyError):
        return []
