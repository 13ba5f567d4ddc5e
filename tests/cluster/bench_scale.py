"""Issue 21, must-show 6: the controller's tick time and its API requests per tick against the real
API server, at several function counts (a benchmark, not a timed test; test_scale.py is the
bounded test built on it).

For each count N: a namespace of its own with the rendered ServiceAccounts and Roles; N function
ConfigMaps written as the control API writes them (ConfigMapFunctions.config_map, by admin); then
`ClusterController.tick()` run in this process with the shoal-controller ServiceAccount's own
token (TokenRequest) and a metrics query that answers an empty vector (no traffic: every function
stays at zero replicas). The first ticks create each function's Deployment and Service (timed and
counted too); then `--ticks` steady ticks, `--interval-s` apart. Every request of the token is
read back from the API server's audit log (up.sh: Metadata level) and put in the tick whose
[start, end] holds its requestReceivedTimestamp.

    tests/cluster/up.sh DIR
    python tests/cluster/bulk_nodes.py --kubeconfig DIR/node-agent.kubeconfig --nodes 1000 &
    PYTHONPATH=. python tests/cluster/bench_scale.py --cluster-dir DIR --functions 200,2000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from node_agent import Api  # noqa: E402
from roles import sa_kubeconfig, shoal_namespace  # noqa: E402


@dataclass
class Tick:
    start: float
    end: float
    applied: int
    requests: Counter = field(default_factory=Counter)  # (verb, resource) -> count

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Run:
    functions: int
    namespace: str
    setup: list[Tick]  # the ticks until nothing was left to create
    steady: list[Tick]


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def function_config_map(name: str, ns: str) -> dict:
    from deploy.cluster.configmaps import ConfigMapFunctions
    from functions.spec import spec_from_dict, spec_to_dict

    spec = spec_from_dict({"name": name, "artifact": f"sha256:{'a' * 64}/{name}.onnx", "slice": "1/4",
                           "scaling": {"max_replicas": 3}})
    return ConfigMapFunctions.config_map(spec_to_dict(spec), 1, ns)


def write_functions(api: Api, ns: str, n: int, threads: int = 8) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"

    def one(i: int) -> None:
        code, data = api.call("POST", path, function_config_map(f"f{i:05d}", ns))
        if code not in (201, 409):
            raise RuntimeError(f"ConfigMap f{i:05d}: {code} {str(data)[:300]}")

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(n)))


def controller_for(kubeconfig: Path, ns: str, identity: str):
    """ClusterController as `shoal controller` builds it (deploy/cluster/controller.py main), in
    this process, with the ServiceAccount token's kubeconfig."""
    from kubernetes import client

    from deploy.cluster.backend import KubernetesBackend
    from deploy.cluster.configmaps import ConfigMapFunctions
    from deploy.cluster.controller import ClusterController
    from deploy.cluster.manifests.render import Cluster
    from deploy.cluster.render import artifact_for

    api = client.ApiClient(_config(kubeconfig))
    backend = KubernetesBackend(Cluster(namespace=ns), client.AppsV1Api(api), client.CoreV1Api(api),
                                client.CoordinationV1Api(api), identity=identity)
    return ClusterController(backend, ConfigMapFunctions(client.CoreV1Api(api), ns), lambda promql: [],
                             lambda spec: artifact_for(spec, "pvc", ""), time.time, lease_s=60)


def _config(kubeconfig: Path):
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return cfg


def timed_tick(ctl) -> Tick:
    t0 = time.time()
    result = ctl.tick()
    t1 = time.time()
    if not result.leader:
        raise RuntimeError("the controller does not hold the Lease")
    return Tick(t0, t1, len(result.applied))


def attribute(audit: Path, username: str, ticks: list[Tick]) -> int:
    """Each request of `username` into the tick whose window holds it; the requests outside any tick."""
    outside = 0
    with open(audit) as f:
        for line in f:
            if username not in line:
                continue
            e = json.loads(line)
            if e.get("stage") != "ResponseComplete" or e["user"].get("username") != username:
                continue
            t = _ts(e["requestReceivedTimestamp"])
            ref = e.get("objectRef") or {}
            key = (e["verb"], ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else ""),
                   int(e["responseStatus"]["code"]))
            for tick in ticks:  # back-to-back ticks share a boundary: no slack, or one takes the next's
                if tick.start <= t <= tick.end:
                    tick.requests[key] += 1
                    break
            else:
                outside += 1  # with --keep, also every earlier run's requests in the namespace
    return outside


def run_one(cluster, n: int, ticks: int, interval_s: float, tmp: Path, log=print, reuse: bool = False) -> Run:
    """reuse: namespace shoal-scale-N, kept from an earlier run (its functions already exist)."""
    ns = f"shoal-scale-{n}" if reuse else f"shoal-scale-{n}-{int(time.time()) % 100000}"
    shoal_namespace(cluster, ns)
    token = sa_kubeconfig(cluster, ns, "shoal-controller", tmp / f"controller-{ns}.kubeconfig")
    t0 = time.monotonic()
    write_functions(cluster.api, ns, n)
    log(f"[{n}] {n} function ConfigMaps written in {time.monotonic() - t0:.1f}s (namespace {ns})")
    ctl = controller_for(token.kubeconfig, ns, f"bench-{n}")
    setup: list[Tick] = []
    while True:  # the first ticks create the Deployments and Services
        tick = timed_tick(ctl)
        setup.append(tick)
        log(f"[{n}] setup tick {len(setup)}: {tick.seconds:.2f}s, {tick.applied} actions")
        if tick.applied == 0 or len(setup) >= 10:
            break
        time.sleep(interval_s)
    steady = []
    for i in range(ticks):
        time.sleep(max(0.0, interval_s - (steady[-1].seconds if steady else 0)))
        steady.append(timed_tick(ctl))
    time.sleep(0.5)  # the audit log is written before each response; this is margin only
    outside = attribute(cluster.dir / "audit.log", token.username, setup + steady)
    log(f"[{n}] {len(steady)} steady ticks; requests outside any tick: {outside}")
    return Run(n, ns, setup, steady)


def per_tick(ticks: list[Tick]) -> dict[tuple, tuple[int, int]]:
    """(verb, resource, code) -> (min, max) per tick over `ticks`."""
    keys = set().union(*(t.requests for t in ticks))
    return {k: (min(t.requests[k] for t in ticks), max(t.requests[k] for t in ticks)) for k in sorted(keys)}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def report(runs: list[Run], nodes: int) -> str:
    out = [f"nodes Ready: {nodes}", ""]
    cols = [f"{r.functions} functions" for r in runs]
    w = 26
    out.append(f"{'':<34}" + "".join(f"{c:>{w}}" for c in cols))

    def row(label: str, values: list[str]) -> None:
        out.append(f"{label:<34}" + "".join(f"{v:>{w}}" for v in values))

    row("setup ticks (creating)", [str(len(r.setup)) for r in runs])
    row("setup tick 1 wall s", [f"{r.setup[0].seconds:.2f}" for r in runs])
    row("setup tick 1 requests", [str(sum(r.setup[0].requests.values())) for r in runs])
    row("steady ticks", [str(len(r.steady)) for r in runs])
    row("steady tick wall s p50", [f"{statistics.median(t.seconds for t in r.steady):.3f}" for r in runs])
    row("steady tick wall s p95", [f"{pct([t.seconds for t in r.steady], 0.95):.3f}" for r in runs])
    row("steady tick wall s max", [f"{max(t.seconds for t in r.steady):.3f}" for r in runs])
    row("steady requests/tick (min-max)",
        [f"{min(sum(t.requests.values()) for t in r.steady)}-{max(sum(t.requests.values()) for t in r.steady)}"
         for r in runs])
    keys = sorted(set().union(*(per_tick(r.steady) for r in runs)))
    for k in keys:
        row(f"  {k[0]} {k[1]} ({k[2]})", [_range(per_tick(r.steady).get(k, (0, 0))) for r in runs])
    out.append("")
    out.append("setup tick 1 requests by verb/resource:")
    keys = sorted(set().union(*(r.setup[0].requests for r in runs)))
    for k in keys:
        row(f"  {k[0]} {k[1]} ({k[2]})", [str(r.setup[0].requests.get(k, 0)) for r in runs])
    return "\n".join(out)


def _range(mm: tuple[int, int]) -> str:
    return str(mm[0]) if mm[0] == mm[1] else f"{mm[0]}-{mm[1]}"


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from conftest import Cluster, read_env

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cluster-dir", required=True, help="a cluster started with tests/cluster/up.sh DIR")
    p.add_argument("--functions", default="200,2000", help="comma-separated function counts")
    p.add_argument("--ticks", type=int, default=20)
    p.add_argument("--interval-s", type=float, default=2.0, help="between tick starts (shoal controller's --tick-s)")
    p.add_argument("--keep", action="store_true", help="namespaces shoal-scale-N, reused if there and left "
                   "for the next run (default: a fresh namespace, deleted at the end)")
    args = p.parse_args(argv)
    d = Path(args.cluster_dir)
    env = read_env(d / "env")
    cluster = Cluster(d, d / "kubeconfig", env["KUBECTL"], env, Api(str(d / "kubeconfig")))
    nodes = cluster.api.ok("GET", "/api/v1/nodes")["items"]
    ready = sum(any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
                for n in nodes)
    print(f"nodes: {len(nodes)}, Ready: {ready}", flush=True)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for n in (int(x) for x in args.functions.split(",")):
                runs.append(run_one(cluster, n, args.ticks, args.interval_s, Path(tmp),
                                    log=lambda m: print(m, flush=True), reuse=args.keep))
        finally:
            if not args.keep:
                for r in runs:
                    cluster.kubectl_run("delete", "namespace", r.namespace, "--wait=false", check=False)
    print()
    print(report(runs, ready))
    return 0


if __name__ == "__main__":
    sys.exit(main())
