"""Rendered Kubernetes manifests: every built-in object, in every mode, valid against the Kubernetes
1.29-1.37 schemas in strict mode; custom resources checked by what knows them (promtool for the
rules, the kserve SDK's models and the Pod schema for the InferenceService, the Prometheus
Operator CRD's required fields for ServiceMonitors); pods hardened; RBAC least privilege;
golden files for the rendering."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from deploy.cluster.render import artifact_for, example_spec, main, render, to_yaml
from deploy.cluster.manifests.gpus import MODES, Sharing
from deploy.cluster.manifests.kserve import inference_service, predictor_as_pod
from deploy.cluster.manifests.render import Cluster

VERSIONS = [f"1.{m}" for m in range(29, 38)]
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "k8s"
CUSTOM = {"ServiceMonitor", "PrometheusRule", "InferenceService"}


def cluster(mode: str) -> Cluster:
    return Cluster(sharing=Sharing(mode=mode))


def rendered(mode: str, kind: str = "deployment", source: str = "pvc") -> list[dict]:
    c = cluster(mode)
    base = {"pvc": "", "url": "https://models.example.com", "oci": "registry.example.com/models"}[source]
    return render(c, [example_spec(c.sharing)], kind=kind, source=source, base=base)


def all_cases():
    for mode in MODES:
        for kind in ("deployment", "inferenceservice"):
            for source in ("pvc", "url", "oci"):
                yield mode, kind, source


def unique_builtin_objects() -> list[dict]:
    """Every built-in object of every mode x function kind x artifact source, each distinct one once
    (most of the control plane is the same across them), InferenceServices' predictors as Pods."""
    seen: dict[str, dict] = {}
    for mode, kind, source in all_cases():
        docs = rendered(mode, kind, source)
        assert any(d["kind"] in ("InferenceService", "Deployment") and "fn-" in d["metadata"]["name"] for d in docs)
        objects = [d for d in docs if d["kind"] not in CUSTOM]
        objects += [predictor_as_pod(d) for d in docs if d["kind"] == "InferenceService"]
        for d in objects:
            seen.setdefault(json.dumps(d, sort_keys=True), d)
    return list(seen.values())


UNIQUE = unique_builtin_objects()


def test_the_cases_cover_every_mode_kind_and_source():
    assert len(list(all_cases())) == 5 * 2 * 3
    kinds = {d["kind"] for d in UNIQUE}
    assert {"Namespace", "ServiceAccount", "Role", "RoleBinding", "Deployment", "Service", "NetworkPolicy",
            "PodDisruptionBudget", "ConfigMap", "PersistentVolumeClaim", "Pod"} <= kinds
    assert len(UNIQUE) > 40


@pytest.mark.parametrize("version", VERSIONS)
def test_every_builtin_object_validates_strict(version):
    for doc in UNIQUE:
        kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError naming the path


def test_strict_validation_catches_a_wrong_field():
    doc = rendered("hami")[-2]  # the function's Deployment
    doc["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True  # typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, "1.37", strict=True)


@pytest.mark.skipif(not shutil.which("promtool") and not os.environ.get("SHOAL_REQUIRE_PROMTOOL"),
                    reason="promtool (Debian's prometheus package) not installed")
def test_alert_rules_pass_promtool(tmp_path):
    rule = next(d for d in rendered("hami") if d["kind"] == "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout
    names = [r["alert"] for r in rule["spec"]["groups"][0]["rules"]]
    assert {"ShoalSLOLatencyBurnFast", "ShoalSLOAvailabilityBurnSlow", "ShoalColdStartStorm"} <= set(names)


def test_service_monitors_have_what_the_crd_requires():
    # monitoring.coreos.com_servicemonitors.yaml: spec.required = [endpoints, selector] (selector: in newer operators)
    monitors = [d for d in rendered("hami") if d["kind"] == "ServiceMonitor"]
    assert [m["metadata"]["name"] for m in monitors] == ["shoal-gateway", "shoal-controller", "shoal-replica"]
    services = {d["metadata"]["name"]: d for d in rendered("hami") if d["kind"] == "Service"}
    for m in monitors:
        assert m["spec"]["selector"]["matchLabels"] and m["spec"]["endpoints"][0]["path"] == "/metrics"
        selected = [s for s in services.values() if m["spec"]["selector"]["matchLabels"].items() <= s["metadata"]
                    ["labels"].items()]
        assert selected and all(p["name"] == m["spec"]["endpoints"][0]["port"] for s in selected
                                for p in s["spec"]["ports"])  # the port name resolves on the Service


def test_inference_service_is_raw_with_no_hpa():
    c = cluster("mig")
    isvc = inference_service(c, example_spec(c.sharing), artifact_for(example_spec(c.sharing), "pvc", ""))
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "none"
    predictor = isvc["spec"]["predictor"]
    assert predictor["minReplicas"] == 0 and predictor["maxReplicas"] == 8
    assert predictor["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == "1"
    assert "container_port" not in str(isvc) and "None" not in str(isvc)  # camelCase, no unset fields


def pod_templates(docs: list[dict]) -> list[dict]:
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"]
    pods += [predictor_as_pod(d)["spec"] for d in docs if d["kind"] == "InferenceService"]
    return pods


@pytest.mark.parametrize("mode, kind, source", [("hami", "deployment", "url"), ("mig", "inferenceservice", "oci"),
                                                ("timeslice", "deployment", "pvc")])
def test_every_pod_is_hardened(mode, kind, source):
    pods = pod_templates(rendered(mode, kind, source))
    assert len(pods) == 3  # gateway, controller, the function's replica
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
            assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"]["type"] == "RuntimeDefault"
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and {"cpu", "memory"} <= set(
                c["resources"]["limits"])
        for c in pod["containers"]:
            assert c["livenessProbe"]["httpGet"]["path"] and c["readinessProbe"]["httpGet"]["path"]
    replica = pods[-1]["containers"][0]
    assert replica["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert replica["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"


def test_namespace_enforces_the_restricted_pod_security_standard():
    ns = rendered("hami")[0]
    assert ns["kind"] == "Namespace" and ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_rbac_is_least_privilege():
    docs = rendered("hami")
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    roles = {d["metadata"]["name"]: d["rules"] for d in docs if d["kind"] == "Role"}
    assert set(roles) == {"shoal-controller", "shoal-gateway"}  # replicas: no API access
    for rules in roles.values():
        for rule in rules:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
            assert "secrets" not in rule["resources"]
    gateway_verbs = {v for r in roles["shoal-gateway"] for v in r["verbs"]}
    assert gateway_verbs == {"list"}  # the gateway only reads
    scale = next(r for r in roles["shoal-controller"] if r["resources"] == ["deployments/scale"])
    assert set(scale["verbs"]) == {"patch"}  # KubernetesBackend scales by a patch of the subresource
    replica_sa = next(d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "shoal-replica")
    assert replica_sa["automountServiceAccountToken"] is False


def test_network_policies_deny_by_default_and_let_only_the_gateway_reach_replicas():
    policies = {d["metadata"]["name"]: d["spec"] for d in rendered("hami") if d["kind"] == "NetworkPolicy"}
    assert policies["shoal-default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": []}
    sources = policies["shoal-replica"]["ingress"][0]["from"]
    components = {s["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for s in sources if "podSelector" in s}
    assert components == {"gateway", "controller"}


def test_device_plugin_config_only_where_the_mode_needs_it():
    for mode in MODES:
        configs = [d for d in rendered(mode) if d["kind"] == "ConfigMap" and "config" in d["metadata"]["name"]]
        if mode in ("timeslice", "mps"):
            (config,) = configs
            plugin = yaml.safe_load(config["data"]["any"])
            key = "timeSlicing" if mode == "timeslice" else "mps"
            assert plugin["sharing"][key]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
        else:
            assert configs == []


@pytest.mark.parametrize("mode", MODES)
def test_golden_files(mode):
    """The rendering, byte for byte. SHOAL_UPDATE_GOLDEN=1 rewrites them (then read the diff)."""
    text = to_yaml(rendered(mode))
    path = GOLDEN / f"{mode}.yaml"
    if os.environ.get("SHOAL_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text


def test_golden_inference_service():
    c = cluster("hami")
    text = to_yaml([inference_service(c, example_spec(c.sharing), artifact_for(example_spec(c.sharing), "pvc", ""))])
    path = GOLDEN / "hami-inferenceservice.yaml"
    if os.environ.get("SHOAL_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.read_text() == text


def test_container_args_are_what_the_roles_accept():
    """Each rendered container's args parse with the parser of the role they start (no drift between the
    manifests and the commands)."""
    from deploy.cli import COMMANDS
    from deploy.cli.fetch import build_parser as fetch_parser
    from deploy.cluster.controller import build_parser as controller_parser
    from deploy.cluster.gateway import build_parser as gateway_parser
    from serving.replica import build_parser as replica_parser

    parsers = {"controller": controller_parser, "replica": replica_parser, "fetch": fetch_parser,
               "gateway": gateway_parser}
    checked = set()
    for mode, kind, source in all_cases():
        for pod in pod_templates(rendered(mode, kind, source)):
            for c in pod["containers"] + pod.get("initContainers", []):
                role, *rest = c.get("command", []) + c["args"] if c.get("command") else c["args"]
                if c.get("command") == ["cp"]:
                    continue  # the model image's own cp
                assert role in COMMANDS, role
                parsers[role]().parse_args(rest)  # SystemExit on an unknown or missing option
                checked.add(role)
    assert checked == {"gateway", "controller", "replica", "fetch"}


def test_cli_writes_a_folder_and_refuses_an_inexpressible_slice(tmp_path, capsys):
    assert main(["render", "--mode", "mps", "--example", "--out", str(tmp_path / "out")]) == 0
    files = sorted(p.name for p in (tmp_path / "out").glob("*.yaml"))
    assert "all.yaml" in files and len(files) == 27  # 26 objects + all.yaml
    assert (tmp_path / "out" / "grafana" / "shoal.json").read_text().startswith("{")
    spec = tmp_path / "f.yaml"
    spec.write_text("name: f\nartifact: sha256:ab/f.onnx\nslice: 1/3\n")
    assert main(["render", "--mode", "mig", "--function-spec", str(spec)]) == 2
    assert "slice 1/3 is not a MIG profile" in capsys.readouterr().err
