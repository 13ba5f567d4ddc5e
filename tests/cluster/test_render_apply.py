"""Issue 21, must-show 1: every object `shoal k8s render` writes, for every GPU sharing mode and
both function kinds, applied with server-side apply to a real API server; the CRD-backed kinds
(ServiceMonitor, PrometheusRule: prometheus-operator's CRDs; InferenceService: KServe's) against
their real CRDs; and Pod Security admission, enforcing the rendered namespace's `restricted`
label, admits every pod the Deployments create, which the real scheduler then places on a node
of that mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import FIELD_MANAGER

from deploy.cluster.manifests.gpus import MODES

pytestmark = pytest.mark.cluster
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.fixture(scope="module")
def crds(cluster):
    """The CRDs from the packages that ship them (tests/cluster/crds.sh), installed once."""
    out = subprocess.run([str(HERE / "crds.sh")], capture_output=True, text=True, timeout=600, check=True)
    crd_dir = Path(out.stdout.strip())
    files = sorted(crd_dir.glob("*.yaml"))
    assert len(files) == 3, files
    for f in files:
        cluster.kubectl_run("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", str(f))
    names = [yaml.safe_load(f.read_text())["metadata"]["name"] for f in files]
    cluster.kubectl_run("wait", "--for=condition=Established", "--timeout=60s",
                        *[f"crd/{n}" for n in names], timeout_s=90)
    return names


def render(mode: str, kind: str, ns: str, out: Path) -> list[dict]:
    subprocess.run([sys.executable, "-m", "deploy.cli", "k8s", "render", "--mode", mode, "--example", "--kind", kind,
                    "--namespace", ns, "--out", str(out)], check=True, cwd=ROOT, timeout=120, capture_output=True)
    return [d for d in yaml.safe_load_all((out / "all.yaml").read_text()) if d]


def artifacts_pv(cluster, ns: str) -> dict:
    """A PV for the rendered artifacts PVC (no provisioner here): the agent maps the claim to the
    cluster's artifacts directory, so the PV's hostPath is only for the binder."""
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"artifacts-{ns}"},
            "spec": {"capacity": {"storage": "50Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                     "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(cluster.dir / "artifacts")},
                     "claimRef": {"namespace": ns, "name": "shoal-artifacts"}}}



def artifacts_storage(cluster, ns: str) -> dict:
    """The artifacts PV (the node agent's local directory) and the `shoal-artifacts` claim bound
    to it, applied; the PV."""
    pv = artifacts_pv(cluster, ns)
    code, body = cluster.apply(f"/api/v1/persistentvolumes/{pv['metadata']['name']}", pv)
    assert code in (200, 201), body
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "shoal-artifacts", "namespace": ns},
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv["metadata"]["name"],
                    "resources": {"requests": {"storage": "1Gi"}}}}
    code, body = cluster.apply(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/shoal-artifacts", pvc)
    assert code in (200, 201), body
    return pv

def kinds(docs: list[dict]) -> set[str]:
    return {d["kind"] for d in docs}


@pytest.mark.parametrize("kind", ["deployment", "inferenceservice"])
@pytest.mark.parametrize("mode", MODES)
def test_rendered_objects_apply_and_their_pods_are_admitted(cluster, crds, tmp_path, mode, kind):
    ns = f"shoal-{mode}-{kind[:3]}"
    docs = render(mode, kind, ns, tmp_path / "rendered")
    assert {"ServiceMonitor", "PrometheusRule", "Deployment", "Namespace"} <= kinds(docs)
    assert ("InferenceService" in kinds(docs)) == (kind == "inferenceservice")
    code, body = cluster.apply(f"/api/v1/persistentvolumes/artifacts-{ns}", artifacts_pv(cluster, ns))
    assert code in (200, 201), body
    # timeslice/mps: the device plugin's config goes to the GPU Operator's namespace, which its
    # install makes (docs/kubernetes.md step 1); stand in for that install.
    others = [d for d in docs if d["metadata"].get("namespace", ns) != ns]
    for other in {d["metadata"]["namespace"] for d in others}:
        cluster.apply(f"/api/v1/namespaces/{other}", {"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": other}})
    try:
        _apply_and_check(cluster, docs, ns, tmp_path / "rendered" / "all.yaml")
    finally:
        for d in others:
            cluster.kubectl_run("-n", d["metadata"]["namespace"], "delete", d["kind"], d["metadata"]["name"],
                                check=False)
        cluster.kubectl_run("delete", "namespace", ns, "--timeout=120s", timeout_s=150, check=False)
        cluster.kubectl_run("delete", "pv", f"artifacts-{ns}", "--wait=false", check=False)


def _apply_and_check(cluster, docs: list[dict], ns: str, all_yaml: Path) -> None:
    # kubectl's server-side apply validates fields strictly (fieldValidation=Strict): a field that
    # the API, or a CRD's structural schema, does not know is an error, not silently pruned.
    out = cluster.kubectl_run("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", str(all_yaml),
                              timeout_s=120).stdout
    applied = [line for line in out.splitlines() if line.endswith("serverside-applied")]
    assert len(applied) == len(docs), out
    names = cluster.kubectl_run("get", "-f", str(all_yaml), "-o", "name").stdout.split()
    assert len(names) == len(docs)

    labels = cluster.get(f"/api/v1/namespaces/{ns}")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # The controller mounts the control API's token from a Secret the operator makes (docs step 3).
    cluster.kubectl_run("-n", ns, "create", "secret", "generic", "shoal-token", "--from-literal=token=test")
    cluster.wait("the artifacts PVC bound", lambda: (cluster.get(
        f"/api/v1/namespaces/{ns}/persistentvolumeclaims/shoal-artifacts") or {}).get("status", {}).get("phase")
        == "Bound", timeout_s=30)

    deployments = [d for d in docs if d["kind"] == "Deployment"]
    for d in deployments:  # the function's Deployment renders at 0: one pod shows its ask is admitted
        if d["spec"]["replicas"] == 0:
            cluster.kubectl_run("-n", ns, "scale", "deployment", d["metadata"]["name"], "--replicas=1")
    for d in deployments:
        _check_pods_created(cluster, ns, d)
    events = cluster.get(f"/api/v1/namespaces/{ns}/events")["items"]
    failed = [f"{e['involvedObject']['name']}: {e['message']}" for e in events if e["reason"] == "FailedCreate"]
    assert not failed, failed


def _check_pods_created(cluster, ns: str, deployment: dict) -> None:
    name = deployment["metadata"]["name"]
    want = max(1, deployment["spec"]["replicas"])
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())

    def pods():
        items = cluster.get(f"/api/v1/namespaces/{ns}/pods", query=[("labelSelector", selector)])["items"]
        return items if len(items) >= want else None

    def failed_create():
        events = cluster.get(f"/api/v1/namespaces/{ns}/events")["items"]
        return [e["message"] for e in events if e["reason"] == "FailedCreate"]

    try:
        items = cluster.wait(f"{want} pods of {name}", pods, timeout_s=60)
    except AssertionError as e:
        raise AssertionError(f"{e}; FailedCreate: {failed_create()}") from None
    for pod in items:
        # Scheduled by the real scheduler (the replica by the hami-scheduler profile in hami mode)
        # onto a node whose labels match its selector and whose allocatable has its GPU ask.
        path = f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}"
        bound = cluster.wait(f"{pod['metadata']['name']} scheduled",
                             lambda: (p := cluster.get(path)) and p["spec"].get("nodeName") and p, timeout_s=30)
        node = cluster.get(f"/api/v1/nodes/{bound['spec']['nodeName']}")
        assert bound["spec"].get("nodeSelector", {}).items() <= node["metadata"]["labels"].items()
        for c in bound["spec"]["containers"]:
            for res in c["resources"].get("limits", {}):
                if res.startswith("nvidia.com/"):
                    assert res in node["status"]["allocatable"], (res, node["metadata"]["name"])
