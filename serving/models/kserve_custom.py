"""A user's KServe custom predictor (a `kserve.Model` subclass in a .py file), run unchanged: Shoal
instantiates it with the function's name, calls `load()` unless it is ready, and runs
`await model(payload, headers)` (preprocess -> predict -> postprocess) as KServe's ModelServer
does, with a `kserve.InferRequest` on V2 (JSON-style data lists, as KServe's REST server builds
them) and the JSON body dict on V1.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import numpy as np

from serving.models.base import LoadError, LoadOptions, Model
from serving.models.usercode import load_module
from serving.protocol.datatypes import numpy_dtype, v2_datatype
from serving.protocol.errors import ModelError


class KServeModel(Model):
    platform = "kserve_custom"
    user_code = True  # no warm-up: KServe calls predict only for a request

    def __init__(self, name: str, path: str, options: LoadOptions):
        super().__init__(name, path, options)
        self.instance = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def load(self) -> None:
        import kserve

        module = load_module(self.path, self.name)
        classes = [
            c for c in vars(module).values()
            if isinstance(c, type) and issubclass(c, kserve.Model) and c.__module__ == module.__name__
        ]
        if len(classes) != 1:
            found = ", ".join(c.__name__ for c in classes) or "none"
            raise LoadError(f"{self.path} must define exactly one kserve.Model subclass (found: {found})")
        self.instance = classes[0](self.name)
        if not self.instance.ready:
            self._run(self.instance.load())
        if not self.instance.ready:
            raise LoadError(f"{classes[0].__name__}.load() returned without setting self.ready")
        self.strict_shapes = False
        self.batchable = False

    def _run(self, value: Any) -> Any:
        """Await coroutines on a loop owned by the executor thread (KServe calls sync
        methods directly and awaits async ones; so does this)."""
        if inspect.isawaitable(value):
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            return self._loop.run_until_complete(value)
        return value

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from kserve import InferInput, InferRequest, InferResponse

        infer_inputs = []
        for name, arr in inputs.items():
            tensor = InferInput(name=name, shape=list(arr.shape), datatype=v2_datatype(arr.dtype))
            tensor.set_data_from_numpy(arr, binary_data=False)
            infer_inputs.append(tensor)
        request = InferRequest(model_name=self.name, infer_inputs=infer_inputs)
        response = self._call(request, {})
        if isinstance(response, InferResponse):
            return {o.name: o.as_numpy() for o in response.outputs}
        if isinstance(response, dict) and isinstance(response.get("outputs"), list):
            return {o["name"]: _json_output(o) for o in response["outputs"]}
        raise ModelError(
            f"on V2 the model must return an InferResponse or a dict with 'outputs', got {type(response).__name__}"
        )

    def predict_v1(self, body: dict[str, Any], headers: dict[str, str]) -> Any:
        return self._call(body, headers)

    def _call(self, payload: Any, headers: dict[str, str]) -> Any:
        result = self._run(self.instance(payload, headers=headers))
        # kserve >= 0.14 returns (response, response_headers).
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
            result = result[0]
        return result


def _json_output(out: dict[str, Any]) -> np.ndarray:
    try:
        dtype = numpy_dtype(out["datatype"])
        return np.asarray(out["data"], dtype=dtype).reshape(out["shape"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"model output {out.get('name')!r} is malformed: {exc}") from None
