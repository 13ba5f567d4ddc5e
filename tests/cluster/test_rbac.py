"""Issue 21, must-show 2: `shoal controller` and `shoal gateway` run as processes with their
rendered ServiceAccounts' own tokens (TokenRequest), not as admin, and do their real work: the
control API stores a function (ConfigMap create, update on a new revision and on its removal),
the controller's ticks hold the Lease (create, get, update), create the function's Deployment and
Service, scale it through the scale subresource on a gateway's poke, roll it to the new revision
(update) and delete both when the function goes; the gateway lists the function ConfigMaps and
the EndpointSlices. Every request each made is read back from the API server's audit log (up.sh)
by the ServiceAccount's username: none is refused, and the set of (apiGroup, resource, verb) each
used is exactly what its rendered Role grants: nothing granted goes unused, nothing used is
ungranted.

Metrics come from `roles.PromStub` (an empty vector for every query): the scale-up is the poke's.
The replica pods stay Pending (no artifacts PVC in this namespace): this test is about the roles'
API calls, and no replica process runs."""

from __future__ import annotations

import json
import re
import secrets
import time
import urllib.request

import httpx
import pytest
from roles import PromStub, Role, audit_events, controller_args, free_port, granted, sa_kubeconfig, shoal_namespace, \
    used, wait_for

pytestmark = pytest.mark.cluster

NS = f"shoal-rbac-{secrets.token_hex(3)}"  # its own, so a reused cluster's audit log has no other run's
HANDLER = b"def handler(request):\n    return {'ok': True}\n"


def _replicas(cluster, name: str):
    d = cluster.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{name}")
    return None if d is None else (d["spec"].get("replicas", 0), d["metadata"]["labels"].get("shoal.dev/revision"))


def test_roles_use_exactly_what_their_roles_grant(cluster, tmp_path):
    t0 = time.monotonic()
    roles = shoal_namespace(cluster, NS)
    ctl_token = sa_kubeconfig(cluster, NS, "shoal-controller", tmp_path / "controller.kubeconfig")
    gw_token = sa_kubeconfig(cluster, NS, "shoal-gateway", tmp_path / "gateway.kubeconfig")
    api_token = secrets.token_hex(16)
    (tmp_path / "api-token").write_text(api_token)
    (tmp_path / "artifacts").mkdir()
    prom = PromStub()
    cport, gport = free_port(), free_port()
    ctl = Role("controller", controller_args(NS, cport, prom.url, tmp_path / "api-token", tmp_path / "artifacts"),
               ctl_token, tmp_path / "controller.log", identity="rbac-controller")
    gw = Role("gateway", ["--namespace", NS, "--host", "127.0.0.1", "--port", str(gport),
                          "--controller-url", f"http://127.0.0.1:{cport}", "--sync-s", "0.5"],
              gw_token, tmp_path / "gateway.log")
    api = httpx.Client(base_url=f"http://127.0.0.1:{cport}", headers={"Authorization": f"Bearer {api_token}"},
                       timeout=10)
    try:
        wait_for("the controller leads (/readyz 200)", lambda: _get(f"http://127.0.0.1:{cport}/readyz") == 200, 30)
        ref = api.post("/api/v1/artifacts", params={"filename": "handler.py"}, content=HANDLER).raise_for_status()
        spec = {"artifact": ref.json()["ref"], "slice": "1/4", "scaling": {"max_replicas": 3}}
        api.put("/api/v1/functions/echo", json=spec).raise_for_status()
        assert wait_for("fn-echo at 0, revision 1", lambda: _replicas(cluster, "fn-echo") == (0, "1"), 30)
        wait_for("Service fn-echo", lambda: cluster.get(f"/api/v1/namespaces/{NS}/services/fn-echo"), 10)
        # the gateway sees the function (its ConfigMap list) and pokes the controller through its own path
        wait_for("the gateway lists echo", lambda: "echo" in _models(gport), 20)
        api.post("/poke", params={"function": "echo", "held": "2"}).raise_for_status()
        wait_for("fn-echo scaled up", lambda: (r := _replicas(cluster, "fn-echo")) and r[0] >= 1, 30)
        spec["scaling"]["max_replicas"] = 4  # a new revision: ConfigMap update, Deployment update
        assert api.put("/api/v1/functions/echo", json=spec).raise_for_status().json()["revision"] == 2
        wait_for("fn-echo at revision 2", lambda: (r := _replicas(cluster, "fn-echo")) and r[1] == "2", 30)
        api.delete("/api/v1/functions/echo").raise_for_status()
        wait_for("fn-echo's Deployment and Service gone", lambda: _replicas(cluster, "fn-echo") is None
                 and cluster.get(f"/api/v1/namespaces/{NS}/services/fn-echo") is None, 30)
        wait_for("the gateway forgets echo", lambda: "echo" not in _models(gport), 20)
        assert ctl.alive() and gw.alive()
    finally:
        ctl.kill(15)
        gw.kill(15)
        prom.close()
        api.close()
    logs = {"controller": ctl.text(), "gateway": gw.text()}
    try:
        for name, token in (("shoal-controller", ctl_token), ("shoal-gateway", gw_token)):
            requests = audit_events(cluster, token.username)
            assert requests, f"no request of {token.username} in the audit log"
            assert {r.credential_id for r in requests} == {token.credential_id}  # the token we made, alone
            refused = [r for r in requests if r.code in (401, 403)]
            assert not refused, f"{name}: refused {refused}"
            errors = [r for r in requests if r.code >= 400 and not (r.code == 404 and r.resource == "leases")]
            assert not errors, f"{name}: {errors}"  # (a Lease not there yet is a 404, then created)
            have, want = used(requests), granted(roles[name])
            assert have - want == set(), f"{name} used what its Role does not grant"
            assert want - have == set(), f"{name}'s Role grants what it never used: {sorted(want - have)}"
            assert {r.namespace for r in requests} == {NS}
        for name, text in logs.items():
            # a 403 status, not a log line's milliseconds ("02:12:40,403": a run of 2026-12-02 failed on it)
            assert not re.search(r"(?<![,.\d])403(?!\d)", text) and "Forbidden" not in text, \
                f"{name} log:\n{text[-3000:]}"
            assert "Traceback" not in text, f"{name} log:\n{text[-3000:]}"
    finally:
        cluster.kubectl_run("delete", "namespace", NS, "--wait=false", check=False)
    print(f"\nrbac test: {time.monotonic() - t0:.1f}s; controller used {sorted(used(audit_events(cluster, ctl_token.username)))}")


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def _models(port: int) -> list[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
            return json.loads(r.read())["models"]
    except OSError:
        return []
