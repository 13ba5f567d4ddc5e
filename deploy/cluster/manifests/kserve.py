"""A function as a KServe InferenceService (built with the kserve SDK's models) whose predictor
is Shoal's replica runtime, in RawDeployment mode with `autoscalerClass: none`: KServe creates
no HPA, and Shoal's controller scales the predictor Deployment (`NAME-predictor`) through its
scale subresource. The predictor pod is `render_function`'s pod.
"""

from __future__ import annotations

import json
from typing import Any

from deploy.cluster.manifests.gpus import gpu_request
from deploy.cluster.manifests.render import (
    FUNCTION_LABEL,
    Artifact,
    Cluster,
    function_name,
    labels,
    replica_pod_spec,
)
from functions.spec import FunctionSpec

# the pod fields of a KServe predictor that are KServe's own, not a PodSpec's
PREDICTOR_ONLY = {"minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "scaleMetricType", "containerConcurrency",
                  "timeout", "canaryTrafficPercent", "logger", "batcher", "labels", "annotations", "deploymentStrategy",
                  "autoScaling", "workerSpec", "storageUris"}


def _model(data: Any, kind: str) -> Any:
    """A kubernetes client model from its JSON form (how the client deserializes API answers)."""
    from kubernetes.client import ApiClient

    return ApiClient().deserialize(json.dumps(data), kind, "application/json")


def inference_service(cluster: Cluster, spec: FunctionSpec, artifact: Artifact, revision: int = 1) -> dict[str, Any]:
    from kserve import V1beta1InferenceService, V1beta1InferenceServiceSpec, V1beta1PredictorSpec, constants
    from kubernetes.client import V1ObjectMeta

    gpu = gpu_request(cluster.sharing, spec.slice)
    pod = replica_pod_spec(cluster, spec, artifact, gpu)
    predictor = V1beta1PredictorSpec(
        min_replicas=spec.scaling.min_replicas, max_replicas=spec.scaling.max_replicas,
        containers=[_model(c, "V1Container") for c in pod["containers"]],
        init_containers=[_model(c, "V1Container") for c in pod.get("initContainers", [])] or None,
        volumes=[_model(v, "V1Volume") for v in pod["volumes"]],
        security_context=_model({"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
                                 "seccompProfile": {"type": "RuntimeDefault"}}, "V1PodSecurityContext"),
        service_account_name=pod["serviceAccountName"], automount_service_account_token=False,
        termination_grace_period_seconds=pod["terminationGracePeriodSeconds"],
        node_selector=pod.get("nodeSelector"), scheduler_name=pod.get("schedulerName"),
        tolerations=[_model(t, "V1Toleration") for t in pod["tolerations"]],
        labels={**labels("replica"), FUNCTION_LABEL: spec.name, "shoal.dev/revision": str(revision)},
        annotations={**gpu.annotations, "shoal.dev/slice": spec.slice.name},
    )
    isvc = V1beta1InferenceService(
        api_version=constants.KSERVE_V1BETA1, kind=constants.KSERVE_KIND_INFERENCESERVICE,
        metadata=V1ObjectMeta(
            name=function_name(spec), namespace=cluster.namespace,
            labels={**labels("replica"), FUNCTION_LABEL: spec.name},
            annotations={"serving.kserve.io/deploymentMode": "RawDeployment",
                         "serving.kserve.io/autoscalerClass": "none",  # no HPA: Shoal's controller scales it
                         "shoal.dev/gpu-sharing": cluster.sharing.mode, "shoal.dev/slice": spec.slice.name}),
        spec=V1beta1InferenceServiceSpec(predictor=predictor),
    )
    return to_manifest(isvc)


def to_manifest(obj: Any) -> Any:
    """The camelCase JSON form of a model tree that mixes the kserve SDK's OpenAPI models (attribute_map)
    and the kubernetes client's pydantic models (aliases), without the unset (None) fields.
    (The kubernetes client's own sanitize_for_serialization gives snake_case for its models nested in
    kserve's, which the API server would reject.)"""
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, (list, tuple)):
        return [to_manifest(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_manifest(v) for k, v in obj.items() if v is not None}
    if hasattr(obj, "model_dump"):  # kubernetes >= 37: pydantic, camelCase aliases
        return obj.model_dump(by_alias=True, exclude_none=True, mode="json")
    if hasattr(obj, "attribute_map"):  # the kserve SDK: OpenAPI-generated classes
        return {obj.attribute_map[k]: to_manifest(getattr(obj, k)) for k in obj.openapi_types
                if getattr(obj, k) is not None}
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def predictor_as_pod(isvc: dict[str, Any]) -> dict[str, Any]:
    """The predictor's pod fields as a v1 Pod, so the embedded PodSpec can be checked against the
    Kubernetes schema (kubernetes-validate knows no InferenceService)."""
    predictor = {k: v for k, v in isvc["spec"]["predictor"].items() if k not in PREDICTOR_ONLY}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": isvc["metadata"]["name"]}, "spec": predictor}
