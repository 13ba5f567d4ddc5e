"""The Python SDK: everything `shoal` does, from a script or a Jupyter notebook.

    from deploy.cli.client import Shoal
    shoal = Shoal()                      # SHOAL_URL / SHOAL_TOKEN, or .shoal/token
    shoal.deploy("digits.onnx", name="digits", slice="1/4", max_replicas=4, wait=True)
    shoal.infer("digits", {"X": x})      # V2 through the gateway -> {name: numpy array}

The URL comes from the argument, else SHOAL_URL, else http://127.0.0.1:8080; the
token from the argument, else SHOAL_TOKEN, else STATE_DIR/token (STATE_DIR:
argument, SHOAL_STATE_DIR, or .shoal), the file `shoal up` writes.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import numpy as np

DEFAULT_URL = "http://127.0.0.1:8080"
Progress = Callable[[str, int, int], None]  # (stage, done, total)


class ShoalError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def default_name(path: Path) -> str:
    stem = path.name.split(".")[0].lower().replace("_", "-")
    return re.sub(r"[^a-z0-9-]", "", stem).strip("-")[:63] or "function"


class Shoal:
    def __init__(self, url: str | None = None, token: str | None = None, state_dir: str | Path | None = None,
                 timeout_s: float = 60.0):
        self.url = (url or os.environ.get("SHOAL_URL") or DEFAULT_URL).rstrip("/")
        self.token = token or os.environ.get("SHOAL_TOKEN") or self._read_token(state_dir)
        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    @staticmethod
    def _read_token(state_dir: str | Path | None) -> str | None:
        path = Path(state_dir or os.environ.get("SHOAL_STATE_DIR") or ".shoal") / "token"
        try:
            return path.read_text().strip()
        except OSError:
            return None

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "Shoal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ control API

    def _call(self, method: str, path: str, **kwargs) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ShoalError(0, f"cannot reach the control plane at {self.url} ({exc}); is `shoal up` running?") from None
        if response.status_code >= 400:
            try:
                message = response.json().get("error", response.text)
            except ValueError:
                message = response.text
            raise ShoalError(response.status_code, message)
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.text

    def upload(self, data: bytes, filename: str, progress: Progress | None = None) -> str:
        """Upload artifact bytes (content-addressed: the same bytes are stored once)."""
        total = len(data)

        def chunks():
            step = 1 << 20
            for start in range(0, total, step):
                yield data[start:start + step]
                if progress:
                    progress("upload", min(total, start + step), total)

        result = self._call("POST", "/api/v1/artifacts", params={"filename": filename}, content=chunks(),
                            headers={"content-length": str(total)})
        return result["ref"]

    def deploy(self, artifact: str | Path, name: str | None = None, *, slice: str = "1/4",
               min_replicas: int | None = None, max_replicas: int | None = None, slo_ms: float = 100.0,
               batch: int = 1, batch_delay_ms: float = 0.0, trust: bool = False, loader: str | None = None,
               idle_to_zero_s: float = 60.0, target_concurrency: float = 4.0, wait: bool = False,
               progress: Progress | None = None, timeout_s: float | None = None,
               initial_replicas: int = 0, keep_alive_max_s: float | None = None) -> dict[str, Any]:
        """Upload and register a function; with wait=True, also start its first replica
        (initial_replicas: the autoscaler starts that many at once, as Knative's initial-scale;
        keep_alive_max_s: the most it is kept idle, None for the platform's bound)."""
        from functions.nuclio import prepare

        path = Path(artifact)
        name = name or default_name(path)
        prepared = prepare(path, name)
        ref = self.upload(prepared.data, prepared.filename, progress)
        scaling = {
            "min_replicas": min_replicas if min_replicas is not None else prepared.hints.get("min_replicas", 0),
            "max_replicas": max_replicas if max_replicas is not None else prepared.hints.get("max_replicas", 8),
            "slo_p95_ms": slo_ms, "idle_to_zero_s": idle_to_zero_s, "target_concurrency": target_concurrency,
            "initial_replicas": initial_replicas,
        }
        if keep_alive_max_s is not None:
            scaling["keep_alive_max_s"] = keep_alive_max_s
        spec = {"artifact": ref, "slice": slice, "trust": trust, "loader": loader, "scaling": scaling,
                "batching": {"max_batch_size": batch, "max_queue_delay_ms": batch_delay_ms}}
        if timeout_s is not None:
            spec["timeout_s"] = timeout_s
        function = self._call("PUT", f"/api/v1/functions/{name}", json=spec)
        if wait:
            if progress:
                progress("start", 0, 1)
            function["first_ready_s"] = self.wait_ready(name)
            if progress:
                progress("start", 1, 1)
        return function

    def wait_ready(self, name: str, timeout_s: float = 120.0) -> float:
        """Start a replica if none runs (a metadata request through the gateway wakes the
        function) and return the seconds until it answered."""
        start = time.perf_counter()
        response = self.http.get(f"/v2/models/{name}", timeout=timeout_s)
        if response.status_code != 200:
            raise ShoalError(response.status_code, _error(response))
        return time.perf_counter() - start

    def functions(self) -> list[dict[str, Any]]:
        return self._call("GET", "/api/v1/functions")["functions"]

    def function(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/functions/{name}")

    def delete(self, name: str) -> None:
        self._call("DELETE", f"/api/v1/functions/{name}")

    def events(self, function: str | None = None, after: int = 0, limit: int = 200) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"after": after, "limit": limit}
        if function:
            params["function"] = function
        return self._call("GET", "/api/v1/events", params=params)["events"]

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/api/v1/status")

    def export(self, name: str) -> str:
        return self._call("GET", f"/api/v1/functions/{name}/export")

    # ------------------------------------------------------------------ inference (through the gateway)

    def invoke(self, name: str, body: dict[str, Any]) -> httpx.Response:
        """Send a raw V2 (`inputs`) or V1 (`instances`) body; returns the HTTP response."""
        path = f"/v1/models/{name}:predict" if "instances" in body else f"/v2/models/{name}/infer"
        return self.http.post(path, json=body)

    def invoke_json(self, name: str, body: Any) -> httpx.Response:
        """Send any JSON value as it is on the V1 route, where a Python handler gets it as
        Nuclio's `event.body` (and a KServe custom model as its payload); the HTTP response."""
        return self.http.post(f"/v1/models/{name}:predict", json=body)

    def infer(self, name: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from serving.protocol.datatypes import v2_datatype

        body = {"inputs": [
            {"name": k, "shape": list(v.shape), "datatype": v2_datatype(v.dtype), "data": v.reshape(-1).tolist()}
            for k, v in ((k, np.asarray(v)) for k, v in inputs.items())
        ]}
        response = self.invoke(name, body)
        if response.status_code != 200:
            raise ShoalError(response.status_code, _error(response))
        return {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in response.json()["outputs"]}


def _error(response: httpx.Response) -> str:
    try:
        return response.json().get("error", response.text)
    except ValueError:
        return response.text
