"""The test cluster itself: nodes Ready with each sharing mode's GPUs, and a pod taken all the way
by the real scheduler, the node agent and the real endpointslice controller."""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import FIELD_MANAGER, pod_ready

from deploy.cluster.manifests.gpus import MODES

pytestmark = pytest.mark.cluster

# What the device plugin of each mode advertises on a node of two A100-80GB (node_agent.gpu_capacity),
# written out here so that a change there shows:
EXPECTED_GPU = {
    "hami": {"nvidia.com/gpu": "20",  # HAMi's deviceSplitCount 10 x 2 cards
             "nvidia.com/gpumem": "163840",  # 2 x 81920 MiB
             "nvidia.com/gpucores": "200"},  # 2 x 100 %
    "timeslice": {"nvidia.com/gpu": "8"},  # 2 cards x 4 replicas
    "mps": {"nvidia.com/gpu": "8"},
    "mig": {"nvidia.com/mig-1g.10gb": "4", "nvidia.com/mig-1g.20gb": "4", "nvidia.com/mig-2g.20gb": "4",
            "nvidia.com/mig-3g.40gb": "4", "nvidia.com/mig-4g.40gb": "4", "nvidia.com/mig-7g.80gb": "4"},
    "vgpu": {"nvidia.com/gpu": "2"},
}
EXPECTED_LABELS = {
    "hami": {"gpu": "on"},
    "timeslice": {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"},
    "mps": {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "mps"},
    "mig": {"nvidia.com/mig.strategy": "mixed"},
    "vgpu": {"nvidia.com/gpu.product": "GRID-A100-20C"},  # what gpus.py selects for a 1/4 slice
}


def test_api_server_is_ready_and_real(cluster):
    assert cluster.get("/version")["minor"] == "37"
    code, body = cluster.api.call("GET", "/readyz", query=[("verbose", "1")])
    assert code == 200, body


@pytest.mark.parametrize("mode", MODES)
def test_gpu_node_is_ready_with_its_mode_capacity(cluster, mode):
    node = cluster.get(f"/api/v1/nodes/{mode}-0")
    assert node is not None, f"no node {mode}-0"
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready["Ready"] == "True", ready
    gpu = {k: v for k, v in node["status"]["allocatable"].items() if k.startswith("nvidia.com/")}
    assert gpu == EXPECTED_GPU[mode]
    assert EXPECTED_LABELS[mode].items() <= node["metadata"]["labels"].items()
    lease = cluster.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{mode}-0")
    assert lease["spec"]["holderIdentity"] == f"{mode}-0"
    # The node lifecycle controller would taint a node whose heartbeats stop (unreachable / not-ready).
    assert not [t for t in node["spec"].get("taints", []) if t["key"].startswith("node.kubernetes.io/")]


def test_node_heartbeats_renew_the_lease(cluster):
    path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/cpu-0"
    first = cluster.get(path)["spec"]["renewTime"]
    cluster.wait("the cpu-0 lease renewed", lambda: cluster.get(path)["spec"]["renewTime"] != first, timeout_s=25)


PLAIN_POD = """
apiVersion: v1
kind: Pod
metadata: {{name: web, namespace: {ns}, labels: {{app: web}}}}
spec:
  securityContext: {{runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, seccompProfile: {{type: RuntimeDefault}}}}
  terminationGracePeriodSeconds: 5
  containers:
  - name: web
    image: python:3.11-slim
    command: [{python}, -m, http.server, "8080", --directory, /srv]
    ports: [{{name: http, containerPort: 8080}}]
    readinessProbe: {{httpGet: {{path: /hello.txt, port: http}}, periodSeconds: 1}}
    securityContext:
      readOnlyRootFilesystem: true
      allowPrivilegeEscalation: false
      capabilities: {{drop: [ALL]}}
    volumeMounts: [{{name: srv, mountPath: /srv}}]
  initContainers:
  - name: write
    image: python:3.11-slim
    command: [/bin/sh, -c, "echo hello from $(POD_NAME) > /srv/hello.txt"]
    env: [{{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}]
    securityContext:
      readOnlyRootFilesystem: true
      allowPrivilegeEscalation: false
      capabilities: {{drop: [ALL]}}
    volumeMounts: [{{name: srv, mountPath: /srv}}]
  volumes: [{{name: srv, emptyDir: {{}}}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: {ns}}}
spec: {{selector: {{app: web}}, ports: [{{port: 80, targetPort: http}}]}}
"""


def test_plain_pod_is_scheduled_run_and_published(cluster, tmp_path):
    ns = "plain"
    cluster.kubectl_run("create", "namespace", ns)
    cluster.kubectl_run("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    (tmp_path / "web.yaml").write_text(PLAIN_POD.format(ns=ns, python=sys.executable))
    cluster.kubectl_run("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", str(tmp_path / "web.yaml"))
    path = f"/api/v1/namespaces/{ns}/pods/web"

    pod = cluster.wait("pod web Ready", lambda: (p := cluster.get(path)) and pod_ready(p) and p, timeout_s=60)
    assert pod["spec"]["nodeName"] == "cpu-0"  # the GPU nodes are tainted nvidia.com/gpu
    scheduled = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled and scheduled[0]["status"] == "True"  # written by kube-scheduler, not by the agent
    ip = pod["status"]["podIP"]
    assert not ip.startswith("127.")
    # The init container ran first, with $(POD_NAME) expanded from the downward API.
    with urllib.request.urlopen(f"http://{ip}:8080/hello.txt", timeout=5) as r:
        assert r.read() == b"hello from web\n"

    def published():
        slices = cluster.get(f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
                             query=[("labelSelector", "kubernetes.io/service-name=web")])["items"]
        return [e for s in slices for e in s.get("endpoints") or []
                if e["addresses"] == [ip] and e["conditions"].get("ready")]

    [endpoint] = cluster.wait("web's ready endpoint in an EndpointSlice", published, timeout_s=30)
    assert endpoint["targetRef"]["name"] == "web"
    assert endpoint["nodeName"] == "cpu-0"

    pid = int(pod["status"]["containerStatuses"][0]["containerID"].rsplit("/", 1)[1])
    assert _uid_of(pid) == 65532  # the pod's runAsUser
    t0 = time.monotonic()
    cluster.kubectl_run("delete", "namespace", ns, "--timeout=60s", timeout_s=90)
    assert cluster.get(path) is None
    assert not Path(f"/proc/{pid}").exists(), "the pod's process outlived its pod"
    assert time.monotonic() - t0 < 30  # http.server ends at SIGTERM: no wait for the 5 s grace


def _uid_of(pid: int) -> int:
    # The agent's pid is that of nsenter, which execs down to the container's command.
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:")))


def test_restricted_namespace_refuses_a_privileged_pod(cluster):
    """Pod Security admission is on and enforcing: the other tests' 'admitted' means something."""
    ns = "psa-check"
    cluster.kubectl_run("create", "namespace", ns)
    try:
        cluster.kubectl_run("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
        code, body = cluster.apply(f"/api/v1/namespaces/{ns}/pods/bad", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad", "namespace": ns},
            "spec": {"containers": [{"name": "c", "image": "x"}]}})  # no securityContext at all
        assert code == 403, body
        assert 'violates PodSecurity "restricted:latest"' in body["message"]
        assert "allowPrivilegeEscalation != false" in body["message"]
    finally:
        cluster.kubectl_run("delete", "namespace", ns, "--wait=false")
