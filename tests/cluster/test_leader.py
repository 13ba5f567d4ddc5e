"""Issue 21, must-show 3: two `shoal controller` processes (`python -m deploy.cli controller`), each
with its own identity (POD_NAME) and its own token of the rendered shoal-controller ServiceAccount.
One holds the Lease; the other follows and writes nothing. `kill -9` of the holder: the other
takes the Lease within the lease duration (measured, from the kill and from the holder's last
renewal), and its decisions continue (it scales a function it was poked for). No function is
scaled by both: from the audit log, told apart by their tokens' JTIs, every write of either to
Deployments, their scale or Services comes while that one holds the Lease (the first holder's
before the kill, the second's after its takeover), and the follower made no write before it.

Metrics: roles.PromStub (empty vectors); scale-ups are pokes. Replica pods stay Pending (no
artifacts PVC): the Deployments' counts are what is checked."""

from __future__ import annotations

import secrets
import signal
import time
import urllib.request

import httpx
import pytest
from roles import PromStub, Role, audit_events, controller_args, free_port, sa_kubeconfig, shoal_namespace, wait_for

pytestmark = pytest.mark.cluster

LEASE_S = 10
TICK_S = 1
WRITES = {"create", "update", "patch", "delete"}
SCALED = {"deployments", "deployments/scale", "services"}


def test_one_leader_and_a_takeover_after_kill_9(cluster, tmp_path):
    t0 = time.monotonic()
    ns = f"shoal-lease-{secrets.token_hex(3)}"
    shoal_namespace(cluster, ns)
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/shoal-controller"
    tokens = {who: sa_kubeconfig(cluster, ns, "shoal-controller", tmp_path / f"{who}.kubeconfig") for who in "ab"}
    assert tokens["a"].credential_id != tokens["b"].credential_id
    api_token = secrets.token_hex(16)
    (tmp_path / "api-token").write_text(api_token)
    (tmp_path / "artifacts").mkdir()
    prom = PromStub()
    ports = {who: free_port() for who in "ab"}
    procs: dict[str, Role] = {}

    def start(who: str) -> Role:
        procs[who] = Role("controller", controller_args(ns, ports[who], prom.url, tmp_path / "api-token",
                                                        tmp_path / "artifacts", LEASE_S, TICK_S),
                          tokens[who], tmp_path / f"{who}.log", identity=f"ctl-{who}")
        return procs[who]

    def api(who: str) -> httpx.Client:
        return httpx.Client(base_url=f"http://127.0.0.1:{ports[who]}", timeout=10,
                            headers={"Authorization": f"Bearer {api_token}"})

    def holder():
        lease = cluster.get(lease_path)
        return lease and lease["spec"].get("holderIdentity")

    def replicas(fn: str):
        d = cluster.get(f"/apis/apps/v1/namespaces/{ns}/deployments/fn-{fn}")
        return d and d["spec"].get("replicas", 0)

    try:
        start("a")
        wait_for("ctl-a holds the Lease", lambda: holder() == "ctl-a", 30)
        start("b")
        wait_for("ctl-b answers /readyz as a follower", lambda: _status(ports["b"], "/readyz") == 503, 30)
        with api("a") as a:
            ref = a.post("/api/v1/artifacts", params={"filename": "h.py"},
                         content=b"def handler(r):\n    return r\n").raise_for_status().json()["ref"]
            for fn in ("one", "two"):
                a.put(f"/api/v1/functions/{fn}", json={"artifact": ref, "slice": "1/4"}).raise_for_status()
            wait_for("fn-one and fn-two at 0", lambda: replicas("one") == 0 and replicas("two") == 0, 30)
            # the follower is poked too: it must not act on it
            api("b").post("/poke", params={"function": "one", "held": "3"}).raise_for_status()
            time.sleep(3 * TICK_S)
            assert replicas("one") == 0, "the follower scaled fn-one"
            a.post("/poke", params={"function": "one", "held": "3"}).raise_for_status()
            wait_for("ctl-a scales fn-one up", lambda: (replicas("one") or 0) >= 1, 30)
        assert holder() == "ctl-a" and _status(ports["b"], "/readyz") == 503
        before = cluster.get(lease_path)["spec"]

        procs["a"].kill(signal.SIGKILL)
        killed = time.time()
        last_renew = _ts(cluster.get(lease_path)["spec"]["renewTime"])  # a's last, now frozen
        wait_for("ctl-b takes the Lease", lambda: holder() == "ctl-b", LEASE_S + 10, every_s=0.05)
        took = time.time()
        lease = cluster.get(lease_path)["spec"]
        acquired = _ts(lease["acquireTime"])
        assert lease["leaseTransitions"] == before["leaseTransitions"] + 1
        from_kill, from_renew = took - killed, acquired - last_renew
        print(f"\ntakeover: {from_kill:.2f}s after kill -9, {from_renew:.2f}s after ctl-a's last renewal "
              f"(lease {LEASE_S}s, tick {TICK_S}s)")
        # b times the lease from when *it* saw the last renewal (up to a tick late) and acts on its next tick
        assert from_renew >= LEASE_S - 0.5, "taken before the lease expired"
        assert from_renew <= LEASE_S + 2 * TICK_S + 1
        assert from_kill <= LEASE_S + 2 * TICK_S + 1
        wait_for("ctl-b answers /readyz as the leader", lambda: _status(ports["b"], "/readyz") == 200, 10)

        # decisions continue: the new leader scales fn-two on a poke, and keeps fn-one
        with api("b") as b:
            b.post("/poke", params={"function": "two", "held": "3"}).raise_for_status()
            wait_for("ctl-b scales fn-two up", lambda: (replicas("two") or 0) >= 1, 30)
        assert (replicas("one") or 0) >= 1
        assert procs["b"].alive()
    finally:
        for p in procs.values():
            p.kill(signal.SIGTERM)
        prom.close()

    try:
        events = audit_events(cluster, tokens["a"].username)
        by = {who: [e for e in events if e.credential_id == tokens[who].credential_id] for who in "ab"}
        assert {e.credential_id for e in events} == {tokens[w].credential_id for w in "ab"}
        assert not [e for e in events if e.code in (401, 403)]
        assert not [e for e in by["a"] if e.time > killed], "ctl-a made a request after its kill -9"
        b_writes = [e for e in by["b"] if e.verb in WRITES]
        b_lease_writes = [e for e in b_writes if e.resource == "leases" and e.code < 300]
        assert b_lease_writes, "ctl-b never wrote the Lease"
        first_take = min(e.time for e in b_lease_writes)
        assert first_take > killed
        assert not [e for e in b_writes if e.time < first_take], "ctl-b wrote while following"
        scaled = {who: [e for e in by[who] if e.verb in WRITES and e.resource in SCALED] for who in "ab"}
        assert all(e.time < killed for e in scaled["a"])
        assert all(e.time > first_take for e in scaled["b"])
        assert {(e.verb, e.resource, e.name) for e in scaled["a"]} >= {("patch", "deployments/scale", "fn-one")}
        assert {(e.verb, e.resource, e.name) for e in scaled["b"]} == {("patch", "deployments/scale", "fn-two")}
        for p in procs.values():
            assert "Traceback" not in p.text(), p.text()[-3000:]
    finally:
        cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)
    print(f"leader test: {time.monotonic() - t0:.1f}s")


def _ts(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0
