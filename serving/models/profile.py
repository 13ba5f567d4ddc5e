"""`profile` models: an emulated device whose service time follows a measured profile, for capacity
planning, CI and benchmarks on machines without a GPU. The service time is slept, not computed,
so it burns no CPU, yet counts in the replica's duty cycle; every output says "emulated". The
latencies hold on the slice the function is deployed with; a replica given another slice (the
autoscaler's resizing) runs them at that slice over its own (`shoal replica --profile-slice`), a
1/8 replica of a profile deployed at 1/4 twice as long, as the simulator's replicas run
(autoscaler.simulator, Profile.ref_slice): a device's work does not grow by cutting it finer.

    kind: profile
    inputs:  [{name: x, datatype: FP32, shape: [-1, 16]}]
    outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]
    latency_ms: {1: 4.0, 8: 6.5, 32: 15.0}   # per batch size, interpolated linearly
    memory_mib: 1200
    load_s: 0.2                               # emulated model load time
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import yaml

from serving.models.base import LoadError, Model, parse_tensor_specs
from serving.protocol.datatypes import numpy_dtype
from serving.protocol.errors import InvalidInput
from serving.protocol.types import TensorSpec


def interpolate_ms(points: list[tuple[int, float]], rows: int) -> float:
    """Latency for `rows` by linear interpolation between profile points; beyond the
    last point the last segment's slope continues (a batch of 64 costs more than 32).
    A single point is a constant latency."""
    if len(points) == 1 or rows <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if rows <= x1:
            return y0 + (y1 - y0) * (rows - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return y1 + (y1 - y0) * (rows - x1) / (x1 - x0)


def parse_profile(doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict) or doc.get("kind") != "profile":
        raise LoadError(f"{where}: a profile is a YAML mapping with 'kind: profile'")
    raw = doc.get("latency_ms")
    if not isinstance(raw, dict) or not raw:
        raise LoadError(f"{where}: 'latency_ms' must map batch sizes to milliseconds, e.g. {{1: 4.0, 8: 6.5}}")
    try:
        points = sorted((int(k), float(v)) for k, v in raw.items())
    except (TypeError, ValueError):
        raise LoadError(f"{where}: 'latency_ms' {raw!r} must map integers to numbers") from None
    if points[0][0] < 1 or any(v < 0 for _, v in points):
        raise LoadError(f"{where}: batch sizes must be >= 1 and latencies >= 0, got {raw!r}")
    return {
        "points": points,
        "inputs": parse_tensor_specs(doc.get("inputs"), where, "inputs"),
        "outputs": parse_tensor_specs(doc.get("outputs"), where, "outputs"),
        "memory_mib": int(doc.get("memory_mib", 0)),
        "load_s": float(doc.get("load_s", 0.0)),
    }


def read_profile(path: str) -> dict[str, Any]:
    """The profile in the YAML file at `path` (parse_profile); LoadError for what is not one."""
    with open(path, encoding="utf-8") as f:
        try:
            doc = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            raise LoadError(f"{path} is not valid YAML: {exc}") from None
    return parse_profile(doc, path)


def declared_metadata(path: str, name: str) -> dict[str, Any]:
    """The V2 model metadata a profile declares, read without loading it (no replica, no load
    time): its name, platform and tensors; the versions and properties only a replica tells."""
    profile = read_profile(path)
    return {"name": name, "platform": ProfileModel.platform, "inputs": [s.to_json() for s in profile["inputs"]],
            "outputs": [s.to_json() for s in profile["outputs"]]}


class ProfileModel(Model):
    platform = "shoal_emulated"
    emulated = True

    def load(self) -> None:
        profile = read_profile(self.path)
        self.points = profile["points"]
        self.memory_mib = profile["memory_mib"]
        self.inputs, self.outputs = profile["inputs"], profile["outputs"]
        self.batchable = all(s.shape[:1] == (-1,) for s in self.inputs)
        time.sleep(profile["load_s"])

    def service_time_s(self, rows: int) -> float:
        """The profile's latency for `rows`, on this replica's slice (LoadOptions.slowdown)."""
        return interpolate_ms(self.points, max(1, rows)) / 1000.0 * self.options.slowdown

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        first = next(iter(inputs.values()), None)
        rows = int(first.shape[0]) if first is not None and first.ndim else 1
        largest = self.points[-1][0]
        if len(self.points) > 1 and rows > largest:
            # beyond the profile is a guess; a huge empty batch would sleep for days
            raise InvalidInput(f"{rows} rows: the profile covers batches of at most {largest} rows")
        time.sleep(self.service_time_s(rows))
        return {o.name: _zeros(o, rows) for o in self.outputs}


def _zeros(spec: TensorSpec, rows: int) -> np.ndarray:
    shape = tuple(rows if i == 0 and d == -1 else max(d, 1) for i, d in enumerate(spec.shape))
    if spec.datatype == "BYTES":
        arr = np.empty(shape, dtype=np.object_)
        arr.fill(b"")
        return arr
    return np.zeros(shape, dtype=numpy_dtype(spec.datatype))
