"""ONNX models on ONNX Runtime, with the CUDA execution provider on a GPU slice and the CPU one
otherwise; tensor names, datatypes and shapes come from the session (the artifact's own).
"""

from __future__ import annotations

import numpy as np

from serving.models.base import LoadError, LoadOptions, Model, dims
from serving.protocol.datatypes import ONNX_TO_V2
from serving.protocol.types import TensorSpec


def providers_for(options: LoadOptions, available: list[str]) -> list:
    """Execution providers for the slice's device: CUDA with the slice's memory limit
    on a GPU (when this onnxruntime build has it), always with the CPU fallback."""
    if options.device.startswith("gpu") and "CUDAExecutionProvider" in available:
        index = int(options.device.partition(":")[2] or 0)
        cuda: dict = {"device_id": index}
        if options.gpu_mem_limit_mib:
            cuda["gpu_mem_limit"] = options.gpu_mem_limit_mib * 1024 * 1024
        return [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


class OnnxModel(Model):
    platform = "onnxruntime_onnx"

    def __init__(self, name: str, path: str, options: LoadOptions):
        super().__init__(name, path, options)
        self.session = None
        self._output_names: list[str] = []

    def load(self) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = max(1, self.options.threads)
        so.inter_op_num_threads = 1
        # Threads that spin while idle burn a shared core's time; the slice is shared.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = 3
        providers = providers_for(self.options, ort.get_available_providers())
        try:
            self.session = ort.InferenceSession(self.path, so, providers=providers)
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidProtobuf types
            raise LoadError(f"{self.path} is not a loadable ONNX model: {exc}") from None
        self.inputs = tuple(_spec(i) for i in self.session.get_inputs())
        self.outputs = tuple(_spec(o) for o in self.session.get_outputs())
        self._output_names = [o.name for o in self.outputs]
        self.batchable = bool(self.inputs) and all(s.shape[:1] == (-1,) for s in self.inputs)

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = self.session.run(self._output_names, inputs)
        return dict(zip(self._output_names, results))


def _spec(arg) -> TensorSpec:
    datatype = ONNX_TO_V2.get(arg.type)
    if datatype is None:
        raise LoadError(f"tensor {arg.name!r} has type {arg.type}, which has no V2 datatype")
    return TensorSpec(arg.name, datatype, dims(arg.shape))
