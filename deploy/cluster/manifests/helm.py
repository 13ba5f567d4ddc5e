"""The Helm chart of Shoal's control plane, made from the same renderer as `shoal k8s render`:
`chart()` returns the rendered objects as templates with the values put back where they came
from. The templates use only Go's built-in actions (no Sprig), and the braces that belong to
Prometheus and Grafana are escaped; a test renders the chart with Go's text/template for every
mode and compares it with `render_control_plane`.
"""

from __future__ import annotations

import re

import yaml

from deploy.cluster.manifests.gpus import MODES, Sharing
from deploy.cluster.manifests.render import Cluster, device_plugin_config, render_control_plane

CHART_VERSION = "0.1.0"
# values that cannot occur in a rendered object by accident: each is put back as its template action
SENTINELS = {
    "shoal-sentinel-ns": "{{ .Values.namespace }}",
    "sentinel.invalid/shoal:sentinel": "{{ .Values.image }}",
    "http://prometheus.sentinel.invalid:9090": "{{ .Values.prometheusUrl }}",
    "shoal-sentinel-pvc": "{{ .Values.artifactsPvc }}",
    "sentinel-monitoring": "{{ .Values.monitoringNamespace }}",
}
REPLICAS = {"shoal-gateway": ("{{ .Values.gateway.replicas }}", 7),
            "shoal-controller": ("{{ .Values.controller.replicas }}", 9)}


def _sentinel_cluster(mode: str) -> Cluster:
    return Cluster(namespace="shoal-sentinel-ns", image="sentinel.invalid/shoal:sentinel",
                   sharing=Sharing(mode=mode), gateway_replicas=7, controller_replicas=9,
                   prometheus_url="http://prometheus.sentinel.invalid:9090", artifacts_pvc="shoal-sentinel-pvc",
                   monitoring_namespace="sentinel-monitoring")


def _escape(text: str) -> str:
    """Literal braces (Prometheus annotations, Grafana legends) as Go template string actions."""
    return re.sub(r"(\{\{|\}\})", lambda m: '{{ "' + m.group(1) + '" }}', text)


def _template(doc: dict) -> str:
    text = _escape(yaml.safe_dump(doc, sort_keys=False, width=10_000))
    for value, action in SENTINELS.items():
        text = text.replace(value, action)
    name = doc["metadata"]["name"]
    if doc["kind"] == "Deployment" and name in REPLICAS:
        action, sentinel = REPLICAS[name]
        text = text.replace(f"  replicas: {sentinel}\n", f"  replicas: {action}\n", 1)
    if doc["kind"] == "Deployment" and name == "shoal-controller":
        for flag, action in (("--gpu-sharing", "{{ .Values.gpuSharing.mode }}"),
                             ("--gpu", "{{ .Values.gpuSharing.gpu }}"),
                             ("--ways", '"{{ .Values.gpuSharing.ways }}"'),
                             ("--hami-policy", "{{ .Values.gpuSharing.hamiPolicy }}"),
                             ("--vgpu-label", "{{ .Values.gpuSharing.vgpuLabel }}")):
            text = re.sub(rf"(- {flag}\n(\s*)- )\S+", lambda m, a=action: m.group(1) + a, text)
    return text


def _device_plugin_template() -> str:
    """The sharing config, for timeslice and mps only, with the shares per GPU from the values."""
    parts = []
    for mode in ("timeslice", "mps"):
        doc = device_plugin_config(Cluster(sharing=Sharing(mode=mode, ways=37)))
        text = yaml.safe_dump(doc, sort_keys=False, width=10_000)
        text = text.replace("replicas: 37", "replicas: {{ .Values.gpuSharing.ways }}")
        text = text.replace("namespace: gpu-operator", "namespace: {{ .Values.gpuSharing.devicePluginNamespace }}")
        parts.append(f'{{{{- if eq .Values.gpuSharing.mode "{mode}" }}}}\n{text}{{{{- end }}}}\n')
    return "".join(parts)


def chart() -> dict[str, str]:
    """{relative path: file text} of the chart."""
    per_mode = {mode: [d for d in render_control_plane(_sentinel_cluster(mode)) if not _is_plugin(d)]
                for mode in MODES}
    templates = [_template(d) for d in per_mode["hami"]]
    for mode, docs in per_mode.items():  # everything but the plugin config is one template for all modes
        if [_template(d) for d in docs] != templates:
            raise AssertionError(f"mode {mode} renders control-plane objects the chart cannot template")
    files = {
        "Chart.yaml": yaml.safe_dump({
            "apiVersion": "v2", "name": "shoal", "version": CHART_VERSION, "appVersion": CHART_VERSION,
            "description": "Serverless inference for many small models on shared GPU slices", "type": "application",
            "kubeVersion": ">=1.29.0-0"}, sort_keys=False),
        "values.yaml": yaml.safe_dump(default_values(), sort_keys=False),
        "templates/device-plugin-config.yaml": _device_plugin_template(),
    }
    for i, (doc, text) in enumerate(zip(per_mode["hami"], templates)):
        name = doc["metadata"]["name"].replace("shoal-sentinel-ns", "shoal")
        files[f"templates/{i:02d}-{doc['kind'].lower()}-{name}.yaml"] = text
    return files


def default_values() -> dict:
    return values_for(Cluster())


def values_for(cluster: Cluster) -> dict:
    """The chart's values that render `cluster`'s control plane."""
    return {
        "namespace": cluster.namespace, "image": cluster.image, "prometheusUrl": cluster.prometheus_url,
        "artifactsPvc": cluster.artifacts_pvc, "monitoringNamespace": cluster.monitoring_namespace,
        "gateway": {"replicas": cluster.gateway_replicas}, "controller": {"replicas": cluster.controller_replicas},
        "gpuSharing": {"mode": cluster.sharing.mode, "gpu": cluster.sharing.gpu, "ways": cluster.sharing.ways,
                       "hamiPolicy": cluster.sharing.hami_policy, "vgpuLabel": cluster.sharing.vgpu_label,
                       "devicePluginNamespace": cluster.device_plugin_namespace},
    }


def _is_plugin(doc: dict) -> bool:
    return doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-config") and \
        doc["metadata"]["name"].startswith("shoal-") and doc["metadata"]["name"] != "shoal-dashboard"
