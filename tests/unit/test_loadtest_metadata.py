"""A load test reads its functions' model metadata without starting them: `shoal loadtest`'s
metadata comes from the control API (`GET /api/v1/functions/NAME/metadata`), which answers from
what a replica of the revision already told the gateway or from an emulated profile's own file,
so a function at zero is still at zero, no replica asked for, when the load begins. The runner's
HTTP client is wired to a real `ControlPlane` in process (ASGI, no sockets, no replica)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from deploy.local.server import ControlPlane
from loadtests import runner

EXAMPLES = Path(__file__).parents[2] / "functions" / "examples"
PROFILE = EXAMPLES / "emulated_resnet.yaml"
HANDLER = EXAMPLES / "digits_handler.py"  # a model only a replica can describe (its code says its tensors)


class Plane:
    """shoal up in process, and the runner's ControlPlane client talking to it."""

    def __init__(self, tmp_path: Path):
        self.plane = ControlPlane(tmp_path / "state", devices="cpu")
        self.asked: list[str] = []  # every path the load test asked, in order
        self.client = runner.ControlPlane("http://shoal", self.plane.token)
        self.client.http = httpx.Client(base_url="http://shoal", transport=httpx.MockTransport(self._forward),
                                        headers={"authorization": f"Bearer {self.plane.token}"})

    def _forward(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(request.url.path)

        async def call() -> httpx.Response:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=self.plane), base_url="http://shoal") as c:
                r = await c.request(request.method, str(request.url), headers=request.headers,
                                    content=request.content)
                return httpx.Response(r.status_code, headers=r.headers, content=r.content)

        return asyncio.run(call())

    def deploy(self, name: str, filename: str, data: bytes) -> None:
        ref = self.client.http.post("/api/v1/artifacts", params={"filename": filename}, content=data).json()["ref"]
        r = self.client.http.put(f"/api/v1/functions/{name}", json={"artifact": ref, "slice": "1/4"})
        assert r.status_code == 200, r.text
        self.asked.clear()

    def untouched(self, name: str) -> bool:
        """Nothing of the function went through the gateway, no replica was asked for or started."""
        return (name not in self.plane.gateway.routes and not self.plane.scaler.replicas
                and not self.plane.scaler._tasks)

    def close(self) -> None:
        self.client.close()
        self.plane.registry.close()


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path)
    yield p
    p.close()


def test_an_emulated_profile_s_metadata_comes_from_its_file_and_starts_nothing(plane):
    plane.deploy("resnet", "resnet.yaml", PROFILE.read_bytes())
    meta = runner._metadata("http://shoal", "resnet", plane.client, from_zero=True)
    assert meta == {"name": "resnet", "platform": "shoal_emulated",
                    "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 8, 8]}],
                    "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]}
    assert plane.asked == ["/api/v1/functions/resnet/metadata"] and plane.untouched("resnet")
    # and a request body can be built from it, as the load test does before it starts Locust
    from loadtests.tensors import body_for

    assert body_for(meta).data


def test_what_a_replica_told_the_gateway_is_answered_off_the_data_path(plane):
    plane.deploy("digits", "digits.py", HANDLER.read_bytes())
    told = b'{"name": "digits", "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, 64]}]}'
    plane.plane.gateway.route("digits").metadata["/v2/models/digits"] = told  # as _forward caches it
    meta = runner._metadata("http://shoal", "digits", plane.client, from_zero=True)
    assert meta["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 64]}]
    assert plane.asked == ["/api/v1/functions/digits/metadata"] and not plane.plane.scaler.replicas


def test_from_zero_refuses_to_start_a_function_to_learn_its_metadata(plane):
    plane.deploy("digits", "digits.py", HANDLER.read_bytes())
    with pytest.raises(runner.LoadTestError, match=r"--from-zero: .*known only once a replica of revision 1 has "
                                                   r"answered.*give --inputs"):
        runner._metadata("http://shoal", "digits", plane.client, from_zero=True)
    assert plane.asked == ["/api/v1/functions/digits/metadata"] and plane.untouched("digits")


def test_without_from_zero_an_unknown_model_is_asked_through_the_gateway(plane):
    """Not from zero: a replica may start to tell it (the run then starts warm, as it says)."""
    plane.deploy("digits", "digits.py", HANDLER.read_bytes())
    plane.plane.gateway.config = type(plane.plane.gateway.config)(hold_timeout_s=0.01)  # no replica will come
    with pytest.raises(runner.LoadTestError, match="GET http://shoal/v2/models/digits: 504"):
        runner._metadata("http://shoal", "digits", plane.client, from_zero=False)
    assert plane.asked == ["/api/v1/functions/digits/metadata", "/v2/models/digits"]
