"""In-memory request and response types of the data path (no HTTP, no JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class Tensor:
    """A named tensor; `data` already has `shape` and the numpy dtype of `datatype`
    (BYTES tensors hold Python `bytes` in an object array)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A model's declared input or output; -1 in `shape` is a free dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: follow the request's binary_data_output


@dataclass(slots=True)
class InferRequest:
    inputs: list[Tensor]
    id: str | None = None
    # None: every output of the model.
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    # The binary tensor extension's request-level `binary_data_output`.
    binary_output: bool = False

    @property
    def rows(self) -> int:
        """Rows along the batch dimension (the first dimension of the first input)."""
        if not self.inputs or not self.inputs[0].shape:
            return 1
        return self.inputs[0].shape[0]


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str | None
    outputs: list[Tensor]
    id: str | None = None
    parameters: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class RawBody:
    """A response a model composed itself (a Nuclio handler's), sent as it is."""

    body: bytes
    content_type: str = "application/json"
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
