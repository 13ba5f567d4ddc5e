"""`shoal k8s render`: Shoal on a Kubernetes cluster as manifests, for one GPU sharing mode.
With `--function-spec` (repeatable) or `--example`, each function's Deployment and Service or its
KServe InferenceService too. One file per object (listed in docs/kubernetes.md), `all.yaml` and
`grafana/shoal.json`, or one YAML stream on stdout without `--out`. A slice the mode cannot
express is an error that names the slices it can (exit 2).

    shoal k8s render --mode hami --gpu A100-80GB --out deploy/rendered/hami
    shoal k8s render --mode mig --function-spec digits.json --artifact-source oci --kind inferenceservice
    shoal k8s helm --out deploy/cluster/manifests/helm/shoal
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from deploy.cluster.manifests.gpus import GPUS, HAMI_POLICIES, MODES, ManifestError, Sharing
from deploy.cluster.manifests.render import ARTIFACT_SOURCES, Artifact, Cluster, render_control_plane, render_function
from functions.spec import FunctionSpec, SpecError, spec_from_dict

EXAMPLE_DIGEST = "3a261e02a02e3b892f4ba77bd16befe3d2260fe72ac3edb5f4a9e1fe0f533291"
EXAMPLE_SLICES = {"hami": "1/4", "timeslice": None, "mps": None, "mig": "1/7", "vgpu": "1/4"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shoal k8s", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="write the manifests")
    r.add_argument("--mode", choices=MODES, default="hami", help="GPU sharing mode of the cluster (default hami)")
    r.add_argument("--gpu", choices=sorted(GPUS), default="A100-80GB", help="the cluster's GPU model")
    r.add_argument("--ways", type=int, default=4, help="timeslice/mps: replicas per GPU (default 4)")
    r.add_argument("--hami-policy", choices=HAMI_POLICIES, default="binpack")
    r.add_argument("--vgpu-label", default="nvidia.com/gpu.product",
                   help="node label carrying the vGPU profile (GFD's, or e.g. vgpu.type)")
    r.add_argument("--namespace", default="shoal")
    r.add_argument("--image", default=Cluster().image)
    r.add_argument("--prometheus-url", default=Cluster().prometheus_url)
    r.add_argument("--function-spec", action="append", default=[], help="a function spec file (JSON or YAML)")
    r.add_argument("--example", action="store_true", help="include the example digits function")
    r.add_argument("--kind", choices=("deployment", "inferenceservice"), default="deployment",
                   help="a function as a Deployment + Service, or as a KServe InferenceService")
    r.add_argument("--artifact-source", choices=ARTIFACT_SOURCES, default="pvc")
    r.add_argument("--artifact-base", default="",
                   help="url: the base URL of the artifacts; oci: the image repository (tag: sha256-DIGEST[:32])")
    r.add_argument("--out", help="a folder (default: one YAML stream on stdout)")
    h = sub.add_parser("helm", help="write the Helm chart of the control plane (the same objects, as templates)")
    h.add_argument("--out", default="deploy/cluster/manifests/helm/shoal")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "helm":
        from deploy.cluster.manifests.helm import chart

        out = Path(args.out)
        for old in out.glob("templates/*.yaml"):
            old.unlink()
        for rel, text in chart().items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_text(text)
        print(f"Helm chart -> {out}/ (helm install shoal {out} --set gpuSharing.mode=mig ...)")
        return 0
    try:
        sharing = Sharing(mode=args.mode, gpu=args.gpu, ways=args.ways, hami_policy=args.hami_policy,
                          vgpu_label=args.vgpu_label)
        cluster = Cluster(namespace=args.namespace, image=args.image, sharing=sharing,
                          prometheus_url=args.prometheus_url)
        specs = [_read_spec(Path(f)) for f in args.function_spec]
        if args.example:
            specs.append(example_spec(sharing))
        docs = render(cluster, specs, kind=args.kind, source=args.artifact_source, base=args.artifact_base)
    except (ManifestError, SpecError, ValueError, OSError) as exc:
        print(f"shoal k8s render: {exc}", file=sys.stderr)
        return 2
    if args.out:
        written = write(Path(args.out), docs)
        print(f"{len(docs)} objects for mode {args.mode} ({args.gpu}) -> {args.out}/ "
              f"({written} files, all.yaml, grafana/shoal.json)")
    else:
        sys.stdout.write(to_yaml(docs))
    return 0


def example_spec(sharing: Sharing) -> FunctionSpec:
    slice_ = EXAMPLE_SLICES[sharing.mode] or f"1/{sharing.ways}"
    return spec_from_dict({"name": "digits", "artifact": f"sha256:{EXAMPLE_DIGEST}/digits.onnx", "slice": slice_,
                           "scaling": {"max_replicas": 8, "slo_p95_ms": 100},
                           "batching": {"max_batch_size": 16, "max_queue_delay_ms": 2}})


def render(cluster: Cluster, specs: list[FunctionSpec], *, kind: str = "deployment", source: str = "pvc",
           base: str = "") -> list[dict[str, Any]]:
    docs = render_control_plane(cluster)
    for spec in specs:
        artifact = artifact_for(spec, source, base)
        if kind == "inferenceservice":
            from deploy.cluster.manifests.kserve import inference_service

            docs.append(inference_service(cluster, spec, artifact))
        else:
            docs += render_function(cluster, spec, artifact)
    return docs


def artifact_for(spec: FunctionSpec, source: str, base: str) -> Artifact:
    """Where the function's artifact is, for each source; the store's ref is `sha256:DIGEST/FILE`."""
    digest, _, filename = spec.artifact.removeprefix("sha256:").partition("/")
    filename = filename or digest
    if source == "pvc":  # the artifact store's own layout (functions/artifacts.py), on the PVC
        return Artifact("pvc", f"sha256/{digest[:2]}/{digest}/{filename}" if filename != digest else filename)
    if source == "url":
        full = digest if re.fullmatch(r"[0-9a-f]{64}", digest) else None
        if full is None:
            raise ManifestError(f"a url artifact is checked by its sha256; {spec.name}'s ref {spec.artifact!r} "
                                "has no full digest")
        return Artifact("url", filename, url=f"{base.rstrip('/')}/{full}/{filename}", sha256=full)
    if not base:
        raise ManifestError("--artifact-source oci needs --artifact-base REPO (the model images' repository)")
    # tagged by the artifact's digest: a new artifact is a new tag, so a node's cached image (IfNotPresent)
    # is never a stale model
    return Artifact("oci", f"models/{filename}", ref=f"{base}:sha256-{digest[:32]}")


def _read_spec(path: Path) -> FunctionSpec:
    text = path.read_text()
    doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return spec_from_dict(doc)


def to_yaml(docs: list[dict[str, Any]]) -> str:
    return "".join("---\n" + yaml.safe_dump(d, sort_keys=False, width=120) for d in docs)


def write(out: Path, docs: list[dict[str, Any]]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.yaml"):
        old.unlink()
    for i, d in enumerate(docs):
        name = f"{i:02d}-{d['kind'].lower()}-{d['metadata']['name']}.yaml"
        (out / name).write_text(yaml.safe_dump(d, sort_keys=False, width=120))
    (out / "all.yaml").write_text(to_yaml(docs))
    dashboard = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "shoal-dashboard")
    (out / "grafana").mkdir(exist_ok=True)
    (out / "grafana" / "shoal.json").write_text(dashboard["data"]["shoal.json"] + "\n")
    return len(docs)

