"""schemathesis against ../shared/specs/open_inference_rest.yaml, on a replica and on the gateway of
`shoal up`: over 1,000 generated requests to each, and none is answered with a 5xx.

The spec writes its path parameters as `${MODEL_NAME}` (a documentation template); they are read as
`{MODEL_NAME}`. Half of the inference requests go to the real model (`digits`, version 1) so the
generated bodies reach the decoder and the model; the rest keep their generated names and versions
(percent-encoded UTF-8, control characters, empty strings)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import start_plane, start_replica

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SPEC = Path(__file__).resolve().parents[3] / "shared" / "specs" / "open_inference_rest.yaml"
# examples per operation: the infer operation gets most; operations without parameters have one case
EXAMPLES = {"post": 700, "get": 200}


def schema():
    doc = yaml.safe_load(SPEC.read_text())
    doc["paths"] = {path.replace("${", "{"): item for path, item in doc["paths"].items()}
    return schemathesis.openapi.from_dict(doc)


def fuzz(base_url: str, headers: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Run every operation of the spec against base_url; (cases sent, 5xx answers)."""
    sent, server_errors = 0, []
    with httpx.Client(base_url=base_url, timeout=30, headers=headers or {}) as client:
        for result in schema().get_all_operations():
            op = result.ok()

            @settings(max_examples=EXAMPLES[op.method], deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(), real_model=st.booleans())
            def check(case, real_model):
                nonlocal sent
                if real_model and case.path_parameters is not None:
                    case.path_parameters.update(MODEL_NAME="digits", MODEL_VERSION="1")
                kwargs = case.as_transport_kwargs(base_url=base_url)
                response = client.request(kwargs["method"], kwargs["url"], headers=kwargs.get("headers"),
                                          params=kwargs.get("params"), json=kwargs.get("json"),
                                          content=kwargs.get("data") if isinstance(kwargs.get("data"), bytes) else None)
                sent += 1
                if response.status_code >= 500:
                    server_errors.append(f"{case.method} {kwargs['url']} -> {response.status_code}: "
                                         f"{response.text[:200]}")

            check()
    return sent, server_errors


def test_replica_answers_no_5xx(digits_onnx):
    replica = start_replica(digits_onnx, "--name", "digits")
    try:
        sent, errors = fuzz(replica.url)
    finally:
        assert replica.stop(15, 30) == 0
    print(f"schemathesis on a replica: {sent} cases, {len(errors)} 5xx")
    assert sent >= 1000, sent
    assert errors == []


def test_gateway_answers_no_5xx(tmp_path, digits_onnx):
    plane = start_plane(tmp_path / "state")
    try:
        with plane.client() as client:
            client.deploy(digits_onnx, "digits", min_replicas=1, max_replicas=2, wait=True)
        sent, errors = fuzz(plane.url)
    finally:
        assert plane.stop() == 0
    print(f"schemathesis on the gateway: {sent} cases, {len(errors)} 5xx")
    assert sent >= 1000, sent
    assert errors == []
