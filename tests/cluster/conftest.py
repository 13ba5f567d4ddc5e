"""The cluster tests' fixtures: one real control plane per session (tests/cluster/up.sh), stopped
with down.sh at the end, and small helpers over its API (server-side apply, waiting on objects).

Run with `make test-cluster` (root: the node agent makes network namespaces). SHOAL_CLUSTER_DIR
reuses a cluster already started with up.sh (and leaves it running); otherwise a fresh one is
started in a temporary directory. Every wait here has a deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from node_agent import Api  # noqa: E402
from roles import wait_for  # noqa: E402

FIELD_MANAGER = "shoal-cluster-tests"


@dataclass
class Cluster:
    dir: Path
    kubeconfig: Path
    kubectl: str
    env: dict[str, str]
    api: Api

    def kubectl_run(self, *args: str, timeout_s: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([self.kubectl, "--kubeconfig", str(self.kubeconfig), *args],
                              capture_output=True, text=True, timeout=timeout_s)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: rc {proc.returncode}\n{proc.stderr}")
        return proc

    def get(self, path: str, **kw):
        code, data = self.api.call("GET", path, **kw)
        return data if code == 200 else None

    def apply(self, path: str, doc: dict):
        """Server-side apply of one object to its resource path (PATCH application/apply-patch+yaml)."""
        return self.api.call("PATCH", path, doc, content_type="application/apply-patch+yaml",
                             query=[("fieldManager", FIELD_MANAGER), ("force", "true")])

    def wait(self, what: str, fn, timeout_s: float = 60, every_s: float = 0.5):
        """fn() until it returns something truthy; AssertionError naming `what` (and fn's last
        value) at the deadline."""
        return wait_for(what, fn, timeout_s, every_s)


def read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> Cluster:
    reuse = os.environ.get("SHOAL_CLUSTER_DIR")
    d = Path(reuse) if reuse else tmp_path_factory.mktemp("cluster")
    if not reuse:
        if os.geteuid() != 0:
            pytest.fail("the cluster tests need root: the node agent makes network namespaces")
        t0 = time.monotonic()
        env = {**os.environ, "SHOAL_PYTHON": sys.executable}  # the node agent and the pods: this venv
        up = subprocess.run([str(HERE / "up.sh"), str(d)], capture_output=True, text=True, timeout=900, env=env)
        if up.returncode != 0:
            pytest.fail(f"up.sh failed ({up.returncode}):\n{up.stderr[-3000:]}")
        print(f"\nup.sh: {time.monotonic() - t0:.1f}s", file=sys.stderr)
    env = read_env(d / "env")
    c = Cluster(d, d / "kubeconfig", env["KUBECTL"], env, Api(str(d / "kubeconfig")))
    yield c
    if not reuse:
        t0 = time.monotonic()
        subprocess.run([str(HERE / "down.sh"), str(d)], timeout=300, check=True)
        print(f"\ndown.sh: {time.monotonic() - t0:.1f}s", file=sys.stderr)


def pod_ready(pod: dict | None) -> bool:
    conds = (pod or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def dumps(obj) -> str:
    return json.dumps(obj, indent=1)[:2000]
