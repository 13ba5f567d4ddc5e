"""Many Node objects kept Ready without replica processes, for the scale benchmark (issue 21,
must-show 6), as Kubernetes' own scale tests (kubemark, KWOK) provide them: no kubelet, only what
a kubelet writes. Each node is created with a HAMi GPU node's capacity and the nvidia.com/gpu
taint, its status patched Ready once, and its Lease in kube-node-lease renewed every
`--heartbeat-s` (default 20 s, spread evenly over the period): the node lifecycle controller
counts a renewed Lease as the node's heartbeat, so the status needs no patch while the Lease
moves (a kubelet re-reports status every 5 min; here every `--status-s`, default 240 s).
At 1,000 nodes and 20 s that is 50 Lease updates a second, which two cores keep up with.

    python tests/cluster/bulk_nodes.py --kubeconfig DIR/node-agent.kubeconfig --nodes 1000 \
        --pid-file DIR/bulk-nodes.pid          (runs until SIGTERM or the pid file goes)
    python tests/cluster/bulk_nodes.py --kubeconfig DIR/kubeconfig --nodes 1000 --check-ready
    python tests/cluster/bulk_nodes.py --kubeconfig DIR/kubeconfig --nodes 1000 --delete

Node names: bulk-0000 .. bulk-NNNN, labelled shoal.dev/bulk-node=true (the node agent's own
nodes are left alone).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from node_agent import Api, _node, gpu_capacity, node_status, now_micro  # noqa: E402

from deploy.cluster.manifests.gpus import Sharing  # noqa: E402

BULK_LABEL = "shoal.dev/bulk-node"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


def bulk_node(i: int) -> dict:
    capacity, labels = gpu_capacity("hami", Sharing(), 2)
    node = _node(f"bulk-{i:04d}", capacity, {**labels, BULK_LABEL: "true"}, taint=True)
    return node


def create(api: Api, node: dict) -> None:
    name = node["metadata"]["name"]
    code, data = api.call("POST", "/api/v1/nodes", {k: v for k, v in node.items() if k != "status"})
    if code not in (201, 409):
        raise RuntimeError(f"create node {name}: {code} {data}")
    api.ok("PATCH", f"/api/v1/nodes/{name}/status", node_status(node, "10.255.0.1"),
           content_type="application/strategic-merge-patch+json")
    renew(api, name)


def renew(api: Api, name: str) -> None:
    spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now_micro()}
    code, _ = api.call("PATCH", f"{LEASES}/{name}", {"spec": spec}, content_type="application/merge-patch+json")
    if code == 404:
        uid = api.ok("GET", f"/api/v1/nodes/{name}")["metadata"]["uid"]
        api.ok("POST", LEASES, {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                "metadata": {"name": name, "namespace": "kube-node-lease", "ownerReferences": [
                                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}]},
                                "spec": spec})
    elif code >= 300:
        raise RuntimeError(f"renew lease {name}: {code}")


def ready_count(api: Api) -> int:
    listing = api.ok("GET", "/api/v1/nodes", query=[("labelSelector", f"{BULK_LABEL}=true")])
    return sum(any(c["type"] == "Ready" and c["status"] == "True" for c in (n.get("status") or {}).get("conditions", []))
               for n in listing["items"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--heartbeat-s", type=float, default=20.0)
    p.add_argument("--status-s", type=float, default=240.0)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--pid-file", default="")
    p.add_argument("--check-ready", action="store_true", help="exit 0 if all --nodes are Ready")
    p.add_argument("--delete", action="store_true", help="delete the bulk nodes and their Leases")
    args = p.parse_args(argv)
    api = Api(args.kubeconfig)
    if args.check_ready:
        n = ready_count(api)
        print(f"{n}/{args.nodes} bulk nodes Ready")
        return 0 if n >= args.nodes else 1
    if args.delete:
        api.call("DELETE", "/api/v1/nodes", query=[("labelSelector", f"{BULK_LABEL}=true")])
        return 0
    nodes = [bulk_node(i) for i in range(args.nodes)]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if args.pid_file:
        Path(args.pid_file).write_text(str(os.getpid()))
    t0 = time.monotonic()
    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(lambda n: create(api, n), nodes))
    print(f"bulk-nodes: {len(nodes)} nodes created and Ready in {time.monotonic() - t0:.1f}s", flush=True)
    last_status = time.monotonic()
    gap = args.heartbeat_s / max(1, len(nodes))
    failures = 0
    with ThreadPoolExecutor(args.threads) as pool:
        while not stop.is_set():
            start = time.monotonic()
            futures = []
            for i, node in enumerate(nodes):
                if stop.wait(max(0.0, start + i * gap - time.monotonic())):
                    break
                futures.append(pool.submit(renew, api, node["metadata"]["name"]))
            for f in futures:
                try:
                    f.result(30)
                except Exception as e:  # noqa: BLE001 -- keep beating
                    failures += 1
                    print(f"bulk-nodes: heartbeat: {e}", flush=True)
            if time.monotonic() - last_status >= args.status_s:
                for node in nodes:
                    pool.submit(api.call, "PATCH", f"/api/v1/nodes/{node['metadata']['name']}/status",
                                node_status(node, "10.255.0.1"),
                                content_type="application/strategic-merge-patch+json")
                last_status = time.monotonic()
            print(f"bulk-nodes: {len(futures)} leases renewed in {time.monotonic() - start:.1f}s "
                  f"({failures} failures so far)", flush=True)
            if args.pid_file and not Path(args.pid_file).exists():
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
