"""The Helm chart (deploy/cluster/manifests/helm/shoal) renders the same objects as `shoal k8s render`.

The chart's templates are rendered with Go's text/template, the engine Helm uses
(tests/tools/gotemplate.go, built with Debian's golang-go), for every GPU sharing mode and for
non-default values, and compared object by object with render_control_plane(). No `helm`
binary can be installed here; the chart uses no Sprig function, so Go's engine is Helm's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy.cluster.manifests.gpus import MODES, Sharing
from deploy.cluster.manifests.helm import chart, default_values, values_for
from deploy.cluster.manifests.render import Cluster, render_control_plane

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "cluster" / "manifests" / "helm" / "shoal"
GO = shutil.which("go")


def test_the_committed_chart_is_what_the_renderer_makes():
    """`shoal k8s helm` regenerates it; SHOAL_UPDATE_GOLDEN=1 rewrites it here."""
    files = chart()
    if os.environ.get("SHOAL_UPDATE_GOLDEN"):
        for rel, text in files.items():
            (CHART / rel).parent.mkdir(parents=True, exist_ok=True)
            (CHART / rel).write_text(text)
    on_disk = {str(p.relative_to(CHART)): p.read_text() for p in CHART.rglob("*.yaml")}
    assert on_disk == files
    assert yaml.safe_load(files["values.yaml"]) == default_values()


@pytest.fixture(scope="module")
def gotemplate(tmp_path_factory):
    if GO is None:
        if os.environ.get("SHOAL_REQUIRE_GO"):
            pytest.fail("SHOAL_REQUIRE_GO is set but go (Debian's golang-go) is not installed")
        pytest.skip("go not installed (apt-get install golang-go; .ci/run installs it)")
    binary = tmp_path_factory.mktemp("go") / "gotemplate"
    env = {**os.environ, "GOCACHE": str(tmp_path_factory.mktemp("gocache")), "GO111MODULE": "off"}
    subprocess.run([GO, "build", "-o", str(binary), str(ROOT / "tests" / "tools" / "gotemplate.go")],
                   check=True, env=env, timeout=300)
    return binary


def helm_render(gotemplate: Path, values: dict, tmp_path: Path) -> list[dict]:
    path = tmp_path / "values.json"
    path.write_text(json.dumps(values))
    out = subprocess.run([str(gotemplate), str(CHART), str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def key(doc: dict) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


CLUSTERS = [Cluster(sharing=Sharing(mode=mode)) for mode in MODES] + [
    Cluster(namespace="prod-ml", image="registry.example.com/shoal:9", gateway_replicas=3, controller_replicas=1,
            prometheus_url="http://prom.example:9090", sharing=Sharing(mode="timeslice", ways=8)),
    Cluster(sharing=Sharing(mode="mig", gpu="H100-80GB"), artifacts_pvc="models", monitoring_namespace="obs"),
    Cluster(sharing=Sharing(mode="hami", hami_policy="spread", gpu="A100-40GB")),
    Cluster(sharing=Sharing(mode="vgpu", gpu="V100-16GB", vgpu_label="vgpu.type", vgpu_series="C")),
]


@pytest.mark.parametrize("cluster", CLUSTERS, ids=lambda c: f"{c.sharing.mode}-{c.namespace}")
def test_the_chart_renders_what_shoal_k8s_render_writes(gotemplate, tmp_path, cluster):
    rendered = sorted(helm_render(gotemplate, values_for(cluster), tmp_path), key=key)
    expected = sorted(render_control_plane(cluster), key=key)
    assert [key(d) for d in rendered] == [key(d) for d in expected]
    for got, want in zip(rendered, expected):
        assert got == want, key(want)


def test_a_missing_value_is_an_error_not_an_empty_string(gotemplate, tmp_path):
    values = values_for(Cluster())
    del values["gpuSharing"]["gpu"]
    path = tmp_path / "values.json"
    path.write_text(json.dumps(values))
    out = subprocess.run([str(gotemplate), str(CHART), str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "gpu" in out.stderr
