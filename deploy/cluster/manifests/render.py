"""Shoal on Kubernetes as manifests (pure: plain dicts in, plain dicts out; no client, no I/O).
`render_control_plane(cluster)` is everything `shoal k8s render` writes for the platform;
`render_function(cluster, spec, artifact)` is what the Kubernetes backend creates for one
function. One image runs every role (`shoal gateway`, `shoal controller`, which holds the
`shoal-controller` Lease, and `shoal replica` on its GPU slice, see gpus.py), and every pod
meets the `restricted` Pod Security Standard (non-root, read-only root filesystem, no
capabilities, RuntimeDefault seccomp, requests and limits, probes on the V2 health endpoints).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from deploy.cluster.manifests.gpus import GpuRequest, Sharing, gpu_request
from deploy.cluster.manifests.labels import FUNCTION_LABEL, labels, selector
from deploy.cluster.manifests.monitoring import grafana_dashboard, prometheus_rule, service_monitors
from functions.spec import LIMITS, FunctionSpec

GATEWAY_PORT = 8080
REPLICA_PORT = 8080
CONTROLLER_PORT = 8081  # /healthz and /metrics
RUN_AS = 65532  # the distroless "nonroot" user
ARTIFACT_SOURCES = ("pvc", "url", "oci")


@dataclass(frozen=True)
class Artifact:
    """Where a replica's model file comes from: `pvc` (`path` in the artifacts PVC, mounted read-only),
    `url` (fetched by an init container and checked against `sha256`) or `oci` (`path` inside the
    image `ref`, copied out by an init container that runs it: the kubelet's image cache is the
    node-local cache, so a node pulls a model once)."""

    source: str
    path: str
    url: str | None = None
    sha256: str | None = None
    ref: str | None = None

    def __post_init__(self) -> None:
        if self.source not in ARTIFACT_SOURCES:
            raise ValueError(f"artifact source {self.source!r}; allowed: {', '.join(ARTIFACT_SOURCES)}")
        if not self.path or self.path.startswith("/") or ".." in self.path.split("/"):
            raise ValueError(f"artifact path {self.path!r} must be relative, without '..'")
        if self.source == "url" and not (self.url and re.fullmatch(r"[0-9a-f]{64}", self.sha256 or "")):
            raise ValueError("a url artifact needs url and its sha256 (64 hex digits)")
        if self.source == "oci" and not self.ref:
            raise ValueError("an oci artifact needs the image ref")

    @property
    def filename(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Cluster:
    namespace: str = "shoal"
    image: str = "ghcr.io/shoal-dev/shoal:0.1.0"
    sharing: Sharing = field(default_factory=Sharing)
    gateway_replicas: int = 2
    controller_replicas: int = 2
    artifacts_pvc: str = "shoal-artifacts"
    monitoring_namespace: str = "monitoring"
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    device_plugin_namespace: str = "gpu-operator"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", self.namespace):
            raise ValueError(f"namespace {self.namespace!r} is not a DNS label")
        if self.gateway_replicas < 1 or self.controller_replicas < 1:
            raise ValueError("gateway and controller need at least one replica each")


def _meta(name: str, cluster: Cluster, component: str, **extra_labels: str) -> dict[str, Any]:
    return {"name": name, "namespace": cluster.namespace, "labels": labels(component, **extra_labels)}


# ---------------------------------------------------------------------- pods


def container_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


def pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"}}


def _probe(path: str, port: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "timeoutSeconds": 2,
            "failureThreshold": failures}


def _resources(cpu: str, memory: str, cpu_limit: str, memory_limit: str, extra: dict[str, str] | None = None
               ) -> dict[str, Any]:
    extra = extra or {}
    return {"requests": {"cpu": cpu, "memory": memory, **extra},
            "limits": {"cpu": cpu_limit, "memory": memory_limit, **extra}}


def _container(name: str, cluster: Cluster, args: list[str], port: int, port_name: str, *, live: str, ready: str,
               resources: dict[str, Any], env: list[dict[str, Any]] | None = None,
               mounts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "name": name, "image": cluster.image, "imagePullPolicy": "IfNotPresent", "args": args,
        "ports": [{"name": port_name, "containerPort": port, "protocol": "TCP"}],
        "env": env or [], "resources": resources, "securityContext": container_security(),
        "livenessProbe": _probe(live, port_name, 10, 3), "readinessProbe": _probe(ready, port_name, 2, 2),
        # startup on the liveness path: a controller that follows is never ready, and must still start
        "startupProbe": _probe(live, port_name, 1, 120),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *(mounts or [])],
    }


def _deployment(name: str, cluster: Cluster, component: str, replicas: int, pod_spec: dict[str, Any],
                pod_labels: dict[str, str], annotations: dict[str, str] | None = None,
                strategy: dict[str, Any] | None = None) -> dict[str, Any]:
    matching = selector(component, **{k: v for k, v in pod_labels.items() if k == FUNCTION_LABEL})
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(name, cluster, component, **pod_labels),
        "spec": {
            "replicas": replicas, "revisionHistoryLimit": 3, "selector": {"matchLabels": matching},
            "strategy": strategy or {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": labels(component, **pod_labels), "annotations": annotations or {}},
                         "spec": {"securityContext": pod_security(), "automountServiceAccountToken": False,
                                  "enableServiceLinks": False, **pod_spec}},
        },
    }


def _tmp_volume() -> dict[str, Any]:
    return {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}


# ---------------------------------------------------------------------- control plane


def render_control_plane(cluster: Cluster) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = [namespace(cluster)]
    docs += service_accounts(cluster)
    docs += rbac(cluster)
    docs += [artifacts_pvc(cluster), gateway(cluster), controller(cluster)]
    docs += services(cluster)
    docs += network_policies(cluster)
    docs += disruption_budgets(cluster)
    docs += service_monitors(cluster)
    docs += [prometheus_rule(cluster), grafana_dashboard(cluster)]
    plugin = device_plugin_config(cluster)
    if plugin is not None:
        docs.append(plugin)
    return docs


def namespace(cluster: Cluster) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": cluster.namespace, "labels": {
        **labels("namespace"),
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/warn": "restricted", "pod-security.kubernetes.io/audit": "restricted"}}}


def service_accounts(cluster: Cluster) -> list[dict[str, Any]]:
    return [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(f"shoal-{c}", cluster, c),
             "automountServiceAccountToken": c != "replica"}
            for c in ("gateway", "controller", "replica")]


def rbac(cluster: Cluster) -> list[dict[str, Any]]:
    """Least privilege, namespaced, and exactly what the roles' code calls (tests/cluster/test_rbac.py
    reads every request of both from a real API server's audit log and compares): the controller
    lists and writes function ConfigMaps (the control API), lists, creates, replaces (a new
    revision) and deletes function Deployments and Services, scales through the scale subresource
    (a patch) and holds its Lease; the gateway lists the function ConfigMaps and the
    EndpointSlices. Nothing is watched (both re-list each tick) and no Event is written (the
    controller's events are kept in memory). The replicas get no API access at all."""
    rules = {
        "controller": [
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list", "create", "update", "delete"]},
            {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["patch"]},
            {"apiGroups": [""], "resources": ["services"], "verbs": ["list", "create", "delete"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "create", "update"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
        ],
        "gateway": [
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]},
        ],
    }
    docs = []
    for component, role_rules in rules.items():
        name = f"shoal-{component}"
        docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                     "metadata": _meta(name, cluster, component), "rules": role_rules})
        docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                     "metadata": _meta(name, cluster, component),
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                     "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": cluster.namespace}]})
    return docs


def artifacts_pvc(cluster: Cluster) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": _meta(cluster.artifacts_pvc, cluster, "artifacts"),
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "50Gi"}}}}


def gateway(cluster: Cluster) -> dict[str, Any]:
    c = _container("gateway", cluster, ["gateway", "--host", "0.0.0.0", "--port", str(GATEWAY_PORT),
                                        "--backend", "kubernetes", "--namespace", cluster.namespace],
                   GATEWAY_PORT, "http", live="/v2/health/live", ready="/v2/health/ready",
                   resources=_resources("500m", "256Mi", "2", "1Gi"))
    spec = {"serviceAccountName": "shoal-gateway", "automountServiceAccountToken": True, "containers": [c],
            "volumes": [_tmp_volume()], "topologySpreadConstraints": [_spread("gateway")]}
    return _deployment("shoal-gateway", cluster, "gateway", cluster.gateway_replicas, spec, {})


def controller(cluster: Cluster) -> dict[str, Any]:
    c = _container("controller", cluster, ["controller", "--backend", "kubernetes", "--namespace", cluster.namespace,
                                           "--leader-elect", "--lease", "shoal-controller",
                                           "--metrics-source", "prometheus", "--prometheus-url", cluster.prometheus_url,
                                           "--gpu-sharing", cluster.sharing.mode, "--gpu", cluster.sharing.gpu,
                                           "--ways", str(cluster.sharing.ways),
                                           "--hami-policy", cluster.sharing.hami_policy,
                                           "--vgpu-label", cluster.sharing.vgpu_label,
                                           "--image", cluster.image, "--artifacts-pvc", cluster.artifacts_pvc,
                                           "--host", "0.0.0.0", "--port", str(CONTROLLER_PORT),
                                           "--token-file", "/var/run/shoal/token", "--artifacts-dir", "/artifacts"],
                   # ready only while it holds the Lease: the Service (API, pokes) reaches the leader alone
                   CONTROLLER_PORT, "http", live="/healthz", ready="/readyz",
                   resources=_resources("200m", "256Mi", "1", "512Mi"),
                   env=[{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                   mounts=[{"name": "token", "mountPath": "/var/run/shoal", "readOnly": True},
                           {"name": "artifacts", "mountPath": "/artifacts"}])
    # the control API's token: a Secret the admin creates (kubectl create secret generic shoal-token
    # --from-literal=token=...), never rendered into the manifests
    spec = {"serviceAccountName": "shoal-controller", "automountServiceAccountToken": True, "containers": [c],
            "volumes": [_tmp_volume(),
                        {"name": "token", "secret": {"secretName": "shoal-token", "defaultMode": 0o400}},
                        {"name": "artifacts", "persistentVolumeClaim": {"claimName": cluster.artifacts_pvc}}],
            "topologySpreadConstraints": [_spread("controller")]}
    return _deployment("shoal-controller", cluster, "controller", cluster.controller_replicas, spec, {})


def _spread(component: str) -> dict[str, Any]:
    return {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector(component)}}


def services(cluster: Cluster) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta("shoal-gateway", cluster, "gateway"),
         "spec": {"type": "ClusterIP", "selector": selector("gateway"),
                  "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta("shoal-controller", cluster, "controller"),
         "spec": {"type": "ClusterIP", "selector": selector("controller"),
                  "ports": [{"name": "http", "port": CONTROLLER_PORT, "targetPort": "http", "protocol": "TCP"}]}},
    ]


def network_policies(cluster: Cluster) -> list[dict[str, Any]]:
    """Deny by default; the gateway takes traffic from anywhere; a replica only from the gateway and
    the controller (and Prometheus for /metrics); the controller only from Prometheus and the gateways."""
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": cluster.monitoring_namespace}}}

    def policy(name: str, component: str | None, ingress: list[dict[str, Any]]) -> dict[str, Any]:
        pods = {"matchLabels": selector(component)} if component else {}
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": _meta(name, cluster, component or "namespace"),
                "spec": {"podSelector": pods, "policyTypes": ["Ingress"], "ingress": ingress}}

    return [
        policy("shoal-default-deny", None, []),
        policy("shoal-gateway", "gateway", [{"ports": [{"port": GATEWAY_PORT, "protocol": "TCP"}]}]),
        policy("shoal-replica", "replica", [{
            "from": [{"podSelector": {"matchLabels": selector("gateway")}},
                     {"podSelector": {"matchLabels": selector("controller")}}, prometheus],
            "ports": [{"port": REPLICA_PORT, "protocol": "TCP"}]}]),
        policy("shoal-controller", "controller", [{  # Prometheus scrapes it; gateways poke it
            "from": [prometheus, {"podSelector": {"matchLabels": selector("gateway")}}],
            "ports": [{"port": CONTROLLER_PORT, "protocol": "TCP"}]}]),
    ]


def disruption_budgets(cluster: Cluster) -> list[dict[str, Any]]:
    """For the gateways. Not for the controllers: a follower is never ready (readiness follows the
    Lease), so any budget would count it unavailable and block draining the leader's node."""
    return [{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
             "metadata": _meta("shoal-gateway", cluster, "gateway"),
             "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector("gateway")}}}]


def device_plugin_config(cluster: Cluster) -> dict[str, Any] | None:
    """The NVIDIA device plugin's sharing config for timeslice and mps (the GPU Operator's
    ClusterPolicy points devicePlugin.config.name at it); None for the other modes."""
    s = cluster.sharing
    if s.mode not in ("timeslice", "mps"):
        return None
    key = "timeSlicing" if s.mode == "timeslice" else "mps"
    config = (f"version: v1\nflags:\n  migStrategy: none\nsharing:\n  {key}:\n    renameByDefault: false\n"
              + ("    failRequestsGreaterThanOne: true\n" if s.mode == "timeslice" else "")
              + f"    resources:\n    - name: nvidia.com/gpu\n      replicas: {s.ways}\n")
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"shoal-{s.mode}-config", "namespace": cluster.device_plugin_namespace,
                         "labels": labels("device-plugin")},
            "data": {"any": config}}


# ---------------------------------------------------------------------- functions


def function_name(spec: FunctionSpec) -> str:
    return f"fn-{spec.name}"


def render_function(cluster: Cluster, spec: FunctionSpec, artifact: Artifact, revision: int = 1
                    ) -> list[dict[str, Any]]:
    """A function's Deployment (at zero replicas: the controller scales it) and its Service."""
    gpu = gpu_request(cluster.sharing, spec.slice)
    name = function_name(spec)
    pod_labels = {FUNCTION_LABEL: spec.name, "shoal.dev/revision": str(revision)}
    deployment = _deployment(name, cluster, "replica", spec.scaling.min_replicas,
                             replica_pod_spec(cluster, spec, artifact, gpu), pod_labels,
                             annotations={**gpu.annotations, "shoal.dev/slice": spec.slice.name,
                                          "shoal.dev/gpu": gpu.description})
    deployment["metadata"]["annotations"] = {"shoal.dev/gpu-sharing": cluster.sharing.mode,
                                             "shoal.dev/slice": spec.slice.name}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, cluster, "replica", **pod_labels),
               "spec": {"type": "ClusterIP", "selector": selector("replica", **{FUNCTION_LABEL: spec.name}),
                        "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}}
    return [deployment, service]


def replica_container(cluster: Cluster, spec: FunctionSpec, artifact: Artifact, gpu: GpuRequest) -> dict[str, Any]:
    b = spec.batching
    model = f"/artifacts/{artifact.path}" if artifact.source == "pvc" else f"/artifacts/{artifact.filename}"
    args = ["replica", model, "--name", spec.name, "--version", spec.version,
            "--host", "0.0.0.0", "--port", str(REPLICA_PORT), "--slice", spec.slice.name, "--device", "gpu:0",
            "--max-batch-size", str(b.max_batch_size), "--max-queue-delay-ms", f"{b.max_queue_delay_ms:g}",
            "--max-queue", str(b.max_queue_requests)]
    if spec.timeout_s != LIMITS.request_timeout_s:
        args += ["--request-timeout-s", f"{spec.timeout_s:g}"]
    if spec.loader:
        args += ["--loader", spec.loader]
    if spec.trust:
        args.append("--trust")
    mount = {"name": "artifacts", "mountPath": "/artifacts", "readOnly": True}
    return _container("replica", cluster, args, REPLICA_PORT, "http", live="/v2/health/live", ready="/v2/health/ready",
                   resources=_resources("500m", "1Gi", "2", "4Gi", gpu.resources), mounts=[mount])


def replica_pod_spec(cluster: Cluster, spec: FunctionSpec, artifact: Artifact, gpu: GpuRequest) -> dict[str, Any]:
    pod: dict[str, Any] = {"serviceAccountName": "shoal-replica", "terminationGracePeriodSeconds": 60,
                           "containers": [replica_container(cluster, spec, artifact, gpu)],
                           "volumes": [_tmp_volume(), *_artifact_volumes(cluster, artifact)]}
    init = _artifact_init(cluster, artifact)
    if init is not None:
        pod["initContainers"] = [init]
    if gpu.node_selector:
        pod["nodeSelector"] = dict(gpu.node_selector)
    if gpu.scheduler_name:
        pod["schedulerName"] = gpu.scheduler_name
    pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return pod


def _artifact_volumes(cluster: Cluster, artifact: Artifact) -> list[dict[str, Any]]:
    if artifact.source == "pvc":
        return [{"name": "artifacts", "persistentVolumeClaim": {"claimName": cluster.artifacts_pvc, "readOnly": True}}]
    return [{"name": "artifacts", "emptyDir": {"sizeLimit": "20Gi"}}]


def _artifact_init(cluster: Cluster, artifact: Artifact) -> dict[str, Any] | None:
    if artifact.source == "pvc":
        return None
    if artifact.source == "url":
        image, args = cluster.image, ["fetch", artifact.url, "--sha256", artifact.sha256,
                                      "--out", f"/artifacts/{artifact.filename}"]
        command = None
    else:  # oci: the model image itself copies its file; the kubelet caches the image per node
        image, command = artifact.ref, ["cp"]
        args = [f"/{artifact.path}", f"/artifacts/{artifact.filename}"]
    init = {"name": "artifact", "image": image, "imagePullPolicy": "IfNotPresent", "args": args,
            "securityContext": container_security(), "resources": _resources("100m", "128Mi", "1", "512Mi"),
            "volumeMounts": [{"name": "artifacts", "mountPath": "/artifacts"}, {"name": "tmp", "mountPath": "/tmp"}]}
    if command:
        init["command"] = command
    return init
