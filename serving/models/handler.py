"""Python handlers in Nuclio's form: `handler(context, event)`, with an optional
`init_context(context)` run once at load.

The handler gets Nuclio's own SDK objects (nuclio_sdk.Context, Event, Response),
so a function written for Nuclio runs unchanged:

- V1 (`/v1/models/N:predict`): `event.body` is the parsed JSON body, any JSON
  value (object, list, string, number), as Nuclio gives a JSON request (`shoal
  invoke N --json ...` and the SDK's `invoke_json` send there); whatever the handler returns (dict, list, str, a
  `(status, body)` tuple or `context.Response`) is converted the way Nuclio does.
- V2 (`/v2/models/N/infer`): `event.body` is `{input name: numpy array}`; the
  handler returns `{output name: array-like}`.

A module may declare its tensors for model metadata and validation:
`INPUTS = [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]` and `OUTPUTS`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import sys
from typing import Any

import numpy as np

from serving.models.base import LoadError, LoadOptions, Model, parse_tensor_specs
from serving.models.usercode import load_module
from serving.protocol.datatypes import numpy_dtype, v2_datatype
from serving.protocol.errors import ModelError, StatusError
from serving.protocol.types import RawBody, TensorSpec


class HandlerModel(Model):
    platform = "nuclio_python"
    v1_any_json = True
    user_code = True  # no warm-up: Nuclio calls a handler only for an event

    def __init__(self, name: str, path: str, options: LoadOptions):
        super().__init__(name, path, options)
        self.module = None
        self.context = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def load(self) -> None:
        import nuclio_sdk

        self.module = load_module(self.path, self.name)
        self.handler = getattr(self.module, "handler", None)
        if not callable(self.handler):
            raise LoadError(f"{self.path} defines no handler(context, event) function")
        logger = nuclio_sdk.Logger(logging.INFO, name=f"shoal.handler.{self.name}")
        logger.set_handler("shoal", sys.stderr, nuclio_sdk.logger.HumanReadableFormatter())
        self.context = nuclio_sdk.Context(logger=logger, platform=nuclio_sdk.Platform("local"))
        self._encoder = nuclio_sdk.json_encoder.Encoder()
        init = getattr(self.module, "init_context", None)
        if callable(init):
            self._call(init, self.context)
        self.inputs = _declared(self.module, "INPUTS", self.path)
        self.outputs = _declared(self.module, "OUTPUTS", self.path)
        self.strict_shapes = bool(self.inputs)
        self.batchable = False

    def _call(self, fn, *args):
        result = fn(*args)
        if asyncio.iscoroutine(result):
            # Async handlers run on a loop owned by the executor thread.
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            result = self._loop.run_until_complete(result)
        return result

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        output = self._call(self.handler, self.context, _event_for_tensors(inputs))
        status, output = _status_and_body(output)
        if status >= 400:
            raise StatusError(status, f"handler answered {status}: {output!r}")
        if not isinstance(output, dict):
            raise ModelError(
                f"on V2 the handler must return {{output name: array}}, got {type(output).__name__}"
            )
        return {str(k): _as_array(v, k, self.outputs) for k, v in output.items()}

    def predict_v1(self, body: Any, headers: dict[str, str]) -> RawBody:
        """Nuclio semantics end to end: the handler's answer becomes the HTTP response
        (status, content type, headers, body) exactly as Nuclio's processor makes it."""
        import nuclio_sdk

        event = nuclio_sdk.Event(
            body=body, content_type="application/json", headers=headers, method="POST",
            path=f"/v1/models/{self.name}:predict", trigger=nuclio_sdk.TriggerInfo("sync", "http"),
        )
        output = self._call(self.handler, self.context, event)
        response = nuclio_sdk.Response.from_entrypoint_output(self._encoder.encode, output)
        payload = response["body"]
        raw = base64.b64decode(payload) if response.get("body_encoding") == "base64" else str(payload).encode()
        return RawBody(
            body=raw, content_type=response.get("content_type") or "text/plain",
            status=int(response.get("status_code", 200)),
            headers={str(k): str(v) for k, v in (response.get("headers") or {}).items()},
        )


def _status_and_body(output: Any) -> tuple[int, Any]:
    """A handler may answer a body, a `(status, body)` tuple or a nuclio Response."""
    if isinstance(output, tuple) and len(output) == 2 and isinstance(output[0], int):
        return output[0], output[1]
    if hasattr(output, "status_code") and hasattr(output, "body"):
        return int(output.status_code), output.body
    return 200, output


def _event_for_tensors(inputs: dict[str, np.ndarray]):
    import nuclio_sdk

    return nuclio_sdk.Event(
        body=inputs, content_type="application/json", method="POST", path="/infer",
        trigger=nuclio_sdk.TriggerInfo("sync", "http"),
    )


def _as_array(value: Any, name: str, declared: tuple[TensorSpec, ...]) -> np.ndarray:
    spec = next((s for s in declared if s.name == name), None)
    if spec is not None:
        dtype = numpy_dtype(spec.datatype)
        if spec.datatype == "BYTES":
            arr = np.asarray(value, dtype=np.object_)
        else:
            arr = np.asarray(value, dtype=dtype)
        return arr
    arr = np.asarray(value)
    try:
        v2_datatype(arr.dtype)
    except ValueError:
        raise ModelError(f"handler output {name!r} has dtype {arr.dtype}, which has no V2 datatype") from None
    return arr


def _declared(module, attr: str, path: str) -> tuple[TensorSpec, ...]:
    raw = getattr(module, attr, None)
    return () if raw is None else parse_tensor_specs(raw, path, attr)
