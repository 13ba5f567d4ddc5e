"""TorchScript models (the `torch` extra). TorchScript carries argument names but not datatypes or
shapes, so tensors come from a sidecar `ARTIFACT.yaml` when present (as in a profile); without
one, inputs are forward()'s argument names accepting any FP32 shape, and outputs OUTPUT__0.. as
in Triton's PyTorch backend. On a GPU slice the module moves to that device and the process's
CUDA memory fraction is capped to the slice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from functions.artifacts import ArtifactError
from functions.sniff import check_kind
from serving.models.base import LoadError, LoadOptions, Model, parse_tensor_specs
from serving.protocol.errors import ModelError
from serving.protocol.types import TensorSpec


class TorchScriptModel(Model):
    platform = "pytorch_libtorch"
    warmup_runs = 2  # the profiling executor records shapes at the first call and optimizes at the second

    def __init__(self, name: str, path: str, options: LoadOptions):
        super().__init__(name, path, options)
        self.module = None

    def load(self) -> None:
        try:
            import torch
        except ImportError:
            raise LoadError("TorchScript needs the torch extra: pip install 'shoal[torch]'") from None
        try:  # torch allocates what the archive declares: a zip bomb is refused from its central directory first
            check_kind(self.path, "torchscript")
        except ArtifactError as exc:
            raise LoadError(str(exc)) from None
        torch.set_num_threads(max(1, self.options.threads))
        self.device = self._device(torch)
        try:
            self.module = torch.jit.load(self.path, map_location=self.device).eval()
        except Exception as exc:
            raise LoadError(f"{self.path} is not a loadable TorchScript module: {exc}") from None
        self._torch = torch
        sidecar = _sidecar(self.path)
        if sidecar:
            self.inputs = parse_tensor_specs(sidecar.get("inputs"), self.path + ".yaml", "inputs")
            self.outputs = parse_tensor_specs(sidecar.get("outputs"), self.path + ".yaml", "outputs")
        else:
            args = [a.name for a in self.module.forward.schema.arguments][1:]  # drop self
            self.inputs = tuple(TensorSpec(a, "FP32", (-1,)) for a in args)
            self.strict_shapes = False
        self.batchable = all(s.shape[:1] == (-1,) for s in self.inputs)

    def _device(self, torch) -> Any:
        if self.options.device.startswith("gpu") and torch.cuda.is_available():
            index = int(self.options.device.partition(":")[2] or 0)
            if self.options.gpu_mem_limit_mib:
                total = torch.cuda.get_device_properties(index).total_memory
                torch.cuda.set_per_process_memory_fraction(
                    min(1.0, self.options.gpu_mem_limit_mib * 1024 * 1024 / total), index
                )
            return torch.device("cuda", index)
        return torch.device("cpu")

    def warm_up(self) -> str:
        """On a GPU, first the device itself, which needs no declared shape: its context and
        cuBLAS's handle, through a small matrix product; then the model on zeros where its
        tensors are declared (Model.warm_up)."""
        done = ""
        if self.device.type == "cuda":
            torch = self._torch
            x = torch.ones((8, 8), device=self.device)
            (x @ x).sum().item()
            done = f"{self.device} started (a matrix product); "
        return done + super().warm_up()

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        args = [torch.from_numpy(np.ascontiguousarray(inputs[s.name])).to(self.device) for s in self.inputs]
        with torch.inference_mode():
            result = self.module(*args)
        return _outputs(result, self.outputs)


def _outputs(result: Any, declared: tuple[TensorSpec, ...]) -> dict[str, np.ndarray]:
    if isinstance(result, dict):
        return {str(k): v.detach().cpu().numpy() for k, v in result.items()}
    items = result if isinstance(result, (tuple, list)) else (result,)
    names = [s.name for s in declared] or [f"OUTPUT__{i}" for i in range(len(items))]
    if len(names) != len(items):
        raise ModelError(f"the module returned {len(items)} tensors but {len(names)} outputs are declared")
    return {n: t.detach().cpu().numpy() for n, t in zip(names, items)}


def _sidecar(path: str) -> dict | None:
    for candidate in (Path(path + ".yaml"), Path(path).with_suffix(".yaml")):
        if candidate.is_file():
            with open(candidate, encoding="utf-8") as f:
                doc = yaml.safe_load(f)
            if not isinstance(doc, dict):
                raise LoadError(f"{candidate} must be a mapping with 'inputs' and 'outputs'")
            return doc
    return None
