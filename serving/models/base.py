"""What every loaded model offers the data path: its declared tensors (read from the artifact where
the format has them), whether its first dimension is a batch dimension, and a synchronous
`predict` run on the slice executor's thread; models that speak V1 natively (Nuclio handlers,
KServe custom models) also implement `predict_v1`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.protocol.types import TensorSpec


class LoadError(RuntimeError):
    """The artifact could not be loaded; the message says why and what was expected."""


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """How to load: the executor's threads, the device the slice is on, and (for an emulated
    profile) how much slower this slice runs than the one its latencies were measured on."""

    threads: int = 1
    device: str = "cpu"  # cpu | gpu:N | emulated:N
    gpu_mem_limit_mib: int | None = None
    trust: bool = False
    version: str = "1"
    # an emulated profile's latencies x this: its measured slice over this replica's (a profile
    # measured on 1/4 run on 1/8: 2.0), as a GPU slice's compute share bounds its speed
    slowdown: float = 1.0


class Model(abc.ABC):
    """A loaded model. `inputs` empty means the model accepts any tensors."""

    platform: str = "unknown"
    emulated: bool = False
    # V1 `predictions` come from this output when set (else one dict per row).
    v1_output: str | None = None
    # A native V1 model that takes any JSON value, not only an object (Nuclio's event.body).
    v1_any_json: bool = False

    def __init__(self, name: str, path: str, options: LoadOptions):
        self.name = name
        self.path = path
        self.options = options
        self.version = options.version
        self.inputs: tuple[TensorSpec, ...] = ()
        self.outputs: tuple[TensorSpec, ...] = ()
        self.batchable = False
        # False when the artifact carries no tensor signature: any shape is accepted.
        self.strict_shapes = True

    @abc.abstractmethod
    def load(self) -> None:
        """Load the artifact and fill in inputs, outputs and batchable."""

    @abc.abstractmethod
    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one (possibly batched) inference; called on the executor thread."""

    warmup_runs: int = 1  # calls of the warm-up batch (TorchScript: 2, its JIT optimizes at the second)
    user_code: bool = False  # a handler or a KServe custom model: called only for a request, never warmed up

    def warm_up(self) -> str:
        """Run the model on zeros before its replica is ready, as Triton's model_warmup does, so
        that its first request does not pay what a first call costs: on a GPU, loading kernels,
        cuBLAS's handle, a JIT's compile (the scorer's first inference through shoal up on an H100
        and an H200 took 0.12-0.20 s, its warm p50 2 ms: docs/gpu.md). On one row of zeros
        (Model.zeros); not for an emulated model (its time is slept). What was done, for the
        replica's log. A model that refuses zeros is left as it is, its error said (it may still
        serve real inputs); the caller checks for a lost device and bounds the time. Called on
        the executor thread, after load()."""
        if self.emulated:
            return "not warmed up: emulated"
        batch = self.zeros(1)
        if isinstance(batch, str):
            return f"not warmed up: {batch}"
        for _ in range(self.warmup_runs):
            self.predict(batch)
        shapes = ", ".join(f"{s.name} {list(batch[s.name].shape)}" for s in self.inputs)
        return f"warmed up on zeros ({shapes}) x{self.warmup_runs}"

    def zeros(self, rows: int) -> dict[str, np.ndarray] | str:
        """A batch of `rows` rows of zeros for every declared input, or why none can be made: only
        where every input's datatype and dims are declared but the first (the batch dim, given
        `rows`), and never for user code (a handler may write, count or call out). E.g. inputs
        x FP32 [-1, 4]: {"x": zeros((rows, 4), float32)}."""
        from serving.protocol.datatypes import numpy_dtype

        if self.user_code:
            return "user code, called only for a request"
        if (not self.inputs or not self.strict_shapes or any(s.datatype == "BYTES" for s in self.inputs)
                or any(d < 0 for s in self.inputs for d in s.shape[1:])):
            return "its inputs' datatypes and dims (but a batch dim) are not all declared"
        return {s.name: np.zeros(tuple(d if d >= 0 else rows for d in s.shape[:1]) + tuple(s.shape[1:]),
                                 numpy_dtype(s.datatype))
                for s in self.inputs}

    def predict_v1(self, body: Any, headers: dict[str, str]) -> Any:
        """Answer a V1 body natively; models that do not raise NotImplementedError."""
        raise NotImplementedError

    @property
    def has_native_v1(self) -> bool:
        return type(self).predict_v1 is not Model.predict_v1


def dims(shape: Any) -> tuple[int, ...]:
    """A framework's shape (ints, None or symbolic names) as V2 dims (-1 for free)."""
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (shape or ()))


def parse_tensor_specs(raw: Any, where: str, what: str) -> tuple[TensorSpec, ...]:
    """Declared tensors, as written in YAML or a module: [{name, datatype, shape}, ...]."""
    from serving.protocol.datatypes import numpy_dtype

    if not isinstance(raw, (list, tuple)) or not raw:
        raise LoadError(f"{where}: '{what}' must be a non-empty list of {{name, datatype, shape}}")
    specs = []
    for item in raw:
        try:
            numpy_dtype(item["datatype"])
            specs.append(TensorSpec(str(item["name"]), item["datatype"], tuple(int(d) for d in item["shape"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise LoadError(f"{where}: bad tensor in '{what}': {item!r} ({exc})") from None
    return tuple(specs)
