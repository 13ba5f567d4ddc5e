"""The Kubernetes backend against a real cluster: runs only when KUBECONFIG points at one.

Creates a namespace of its own, a function Deployment at zero, scales it through the scale
subresource, takes the controller Lease, and removes everything. It checks the API's answers,
not pod scheduling (the cluster may have no GPU for the replica's slice)."""

from __future__ import annotations

import os
import uuid

import pytest

pytestmark = pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="no KUBECONFIG: no cluster to test against")


def test_create_scale_lead_delete_on_a_live_cluster():
    from kubernetes import client, config

    from deploy.cluster.backend import Desired, KubernetesBackend
    from deploy.cluster.render import artifact_for, example_spec
    from deploy.cluster.manifests.render import Cluster, namespace

    config.load_kube_config()
    cluster = Cluster(namespace=f"shoal-e2e-{uuid.uuid4().hex[:6]}")
    core = client.CoreV1Api()
    core.create_namespace(namespace(cluster))
    try:
        b = KubernetesBackend(cluster, client.AppsV1Api(), core, client.CoordinationV1Api(), identity="e2e")
        spec = example_spec(cluster.sharing)
        want = {"digits": Desired(spec, 1, 0, artifact_for(spec, "pvc", ""))}
        assert b.reconcile(want).applied == ["create digits to 0"]
        want["digits"] = Desired(spec, 1, 2, want["digits"].artifact)
        assert b.reconcile(want).applied == ["scale digits to 2"]
        assert b.scale_of("digits") == 2
        assert b.lead(duration_s=15) is True
        assert KubernetesBackend(cluster, client.AppsV1Api(), core, client.CoordinationV1Api(),
                                 identity="other").lead(duration_s=15) is False
        assert b.reconcile({}).applied == ["delete digits"]
        assert b.observe() == {}
    finally:
        core.delete_namespace(cluster.namespace)
