"""Helpers for running Shoal's cluster roles (`shoal controller`, `shoal gateway`) as processes
against the test cluster, each with its rendered ServiceAccount's own token (TokenRequest, through
`kubectl create token`), and for reading what they did from the API server's audit log
(up.sh: DIR/audit.log, Metadata level, every service account outside kube-system).

- `shoal_namespace`: the rendered Namespace, ServiceAccounts, Roles and RoleBindings, applied.
- `sa_kubeconfig`: a kubeconfig holding a fresh token of one ServiceAccount (its own JTI: two
  processes with two tokens of one ServiceAccount are told apart in the audit log).
- `PromStub`: a tiny Prometheus on 127.0.0.1 that answers every instant query with an empty
  vector (no traffic measured), so a tick reads metrics and a gateway's poke decides.
- `Role`: one `python -m deploy.cli ROLE ...` process, its own process group and log.
- `audit_events`: the audit log's completed requests of one user.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from deploy.cluster.manifests.render import Cluster as Rendered
from deploy.cluster.manifests.render import namespace, rbac, service_accounts

ROOT = Path(__file__).resolve().parents[2]

_PATHS = {"Namespace": "/api/v1/namespaces/{name}",
          "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts/{name}",
          "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{name}",
          "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/{name}"}


def shoal_namespace(cluster, ns: str) -> dict[str, list[dict]]:
    """Apply the rendered namespace, service accounts and RBAC; the Roles' rules by role name."""
    rendered = Rendered(namespace=ns)
    docs = [namespace(rendered), *service_accounts(rendered), *rbac(rendered)]
    for d in docs:
        meta = d["metadata"]
        code, body = cluster.apply(_PATHS[d["kind"]].format(ns=meta.get("namespace"), name=meta["name"]), d)
        assert code in (200, 201), body
    return {d["metadata"]["name"]: d["rules"] for d in docs if d["kind"] == "Role"}


_GIVEN: set[int] = set()  # ports free_port handed out in this process


def free_port() -> int:
    """A free loopback port, never one handed out before in this process: the kernel may give a
    just-closed port again, and once the gateway and Prometheus of one test got the same one."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


@dataclass
class Token:
    kubeconfig: Path
    username: str
    credential_id: str  # the audit log's user.extra["authentication.kubernetes.io/credential-id"]


def sa_kubeconfig(cluster, ns: str, sa: str, path: Path) -> Token:
    """A TokenRequest for `sa` (as admin: `kubectl create token`) and a kubeconfig that uses it."""
    token = cluster.kubectl_run("-n", ns, "create", "token", sa, "--duration=1h").stdout.strip()
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{cluster.env['API_PORT']}",
                                               "certificate-authority": str(cluster.dir / "pki" / "ca.crt")}}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": sa, "namespace": ns}}]}))
    return Token(path, f"system:serviceaccount:{ns}:{sa}", f"JTI={claims['jti']}")


class PromStub:
    """Prometheus' /api/v1/query, answering an empty vector to every query; counts the queries."""

    def __init__(self):
        stub = self
        self.queries = 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                stub.queries += 1
                body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
                self.send_response(200 if self.path.startswith("/api/v1/query") else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Role:
    """`python -m deploy.cli ROLE ARGS` with KUBECONFIG=token's; its own process group and log."""

    def __init__(self, role: str, args: list[str], token: Token, log: Path, identity: str | None = None):
        env = {**os.environ, "KUBECONFIG": str(token.kubeconfig), "PYTHONPATH": str(ROOT)}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        if identity:
            env["POD_NAME"] = identity
        self.log, self.token, self.identity = log, token, identity
        self._out = open(log, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "deploy.cli", role, *args], cwd=ROOT, env=env,
                                     stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self._out.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def controller_args(ns: str, port: int, prometheus: str, token_file: Path, artifacts: Path,
                    lease_s: float = 10, tick_s: float = 1) -> list[str]:
    return ["--namespace", ns, "--gpu-sharing", "hami", "--prometheus-url", prometheus, "--host", "127.0.0.1",
            "--port", str(port), "--token-file", str(token_file), "--artifacts-dir", str(artifacts),
            "--lease-s", str(lease_s), "--tick-s", str(tick_s)]


@dataclass(frozen=True)
class Request:
    """One completed API request, from the audit log."""

    time: float  # stageTimestamp, seconds since the epoch
    verb: str
    group: str  # "" for the core group
    resource: str  # with its subresource: deployments/scale
    name: str | None
    namespace: str | None
    code: int
    credential_id: str | None
    uri: str


def _ts(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def audit_events(cluster, username: str) -> list[Request]:
    out = []
    with open(cluster.dir / "audit.log") as f:
        for line in f:
            e = json.loads(line)
            if e.get("stage") != "ResponseComplete" or e["user"].get("username") != username:
                continue
            ref = e.get("objectRef") or {}
            resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            cred = ((e["user"].get("extra") or {}).get("authentication.kubernetes.io/credential-id") or [None])[0]
            out.append(Request(_ts(e["stageTimestamp"]), e["verb"], ref.get("apiGroup", ""), resource,
                               ref.get("name"), ref.get("namespace"), int(e["responseStatus"]["code"]), cred,
                               e["requestURI"]))
    return out


def granted(rules: list[dict]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) for every combination a Role's rules grant."""
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def used(requests: list[Request]) -> set[tuple[str, str, str]]:
    return {(r.group, r.resource, r.verb) for r in requests}


def wait_for(what: str, fn, timeout_s: float = 30, every_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"{what}: not after {timeout_s}s (last: {str(last)[:500]})")
