"""DataPlane, the request core of a replica; it knows no HTTP. It validates requests against the
model's declared tensors, queues them for the batch loop, runs batches on the slice executor and
builds responses; the REST adapter (serving/replica.py) maps its exceptions to statuses with the
one table in serving/protocol/errors.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from functions.spec import LIMITS, BatchingSpec
from serving import __version__
from serving.batch_loop import BatchLoop, Pending
from serving.executor import SliceExecutor, device_lost
from serving.metrics import ReplicaMetrics
from serving.models.base import Model
from serving.protocol.codec import cast_json_array
from serving.protocol.datatypes import numpy_dtype, v2_datatype
from serving.protocol.errors import (
    InferenceError,
    InferenceTimeout,
    InvalidInput,
    ModelError,
    ModelNotFound,
    ModelNotReady,
)
from serving.protocol.types import InferRequest, InferResponse, RawBody, Tensor, TensorSpec

log = logging.getLogger("shoal.dataplane")

SERVER_EXTENSIONS = ["binary_tensor_data"]


class DataPlane:
    def __init__(
        self,
        model: Model,
        executor: SliceExecutor,
        metrics: ReplicaMetrics,
        batching: BatchingSpec,
        request_timeout_s: float = LIMITS.request_timeout_s,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.model = model
        self.executor = executor
        self.metrics = metrics
        self.request_timeout_s = request_timeout_s
        self.ready = False
        self.lost: str | None = None  # the sticky CUDA error a model call met (executor.device_lost)
        self.on_lost: Callable[[str], None] | None = None  # told once, when the device is lost
        self._batching = batching
        self._loop = BatchLoop(batching, self._execute, clock)
        metrics.queued.set_function(lambda: len(self._loop))
        metrics.stalled.set_function(executor.stalled_s)
        self._clock = clock

    # ------------------------------------------------------------------ lifecycle

    async def load(self) -> None:
        """Load the model, warm it up (Model.warm_up: its first request runs at speed), time its
        batches (_probe) and serve; the model-load gauge and a cold start's `load` phase count
        them all. A warm-up that loses the device is told as a call's would be (on_lost: the
        replica exits with status 4, to be replaced) and the replica never serves; one that runs
        past the request timeout fails the load; any other error of it is logged (a warning),
        the batches are not probed (the model refuses zeros) and the replica serves."""
        start = self._clock()
        await self.executor.run_untimed(self.model.load)
        loaded = self._clock()
        spec = effective_batching(self._batching, self.model)
        try:
            done = await asyncio.wait_for(self.executor.run_untimed(self.model.warm_up), self.request_timeout_s)
        except asyncio.TimeoutError:
            raise RuntimeError(f"the model's warm-up ran past the request timeout ({self.request_timeout_s:g} s)") from None
        except Exception as exc:
            if self._check_lost(exc):
                return
            log.warning("model %s loaded, not warmed up: it raised %s: %s", self.model.name, type(exc).__name__,
                        str(exc).strip()[:300])
        else:
            took = "" if done.startswith("not warmed up") else f" in {self._clock() - loaded:.3f} s"
            log.info("model %s loaded in %.3f s, %s%s", self.model.name, loaded - start, done, took)
            if spec.max_batch_size > 1 and not await self._probe(spec.max_batch_size):
                return
        self._loop.set_spec(spec)
        self.metrics.model_load.set(self._clock() - start)
        self._loop.start()
        self.ready = True
        self.metrics.ready.set(1)

    async def _probe(self, largest: int) -> bool:
        """Time one batch of 1 row and one of `largest` (max_batch_size) on zeros before the
        replica is ready, each said in shoal_replica_batch_probe_seconds{rows}: the controller
        learns from them how a batch grows before its load has formed one
        (autoscaler.metrics.seed_batch_latency). Without it a function whose requests spread
        over several replicas, each running them alone, teaches only batches of one, and the
        policy sizes it as a model that does not batch: the conversation trace at 4x held 3
        replicas where 2 carry it (docs/benchmarks.md, "A real trace never run before"). Triton's
        model_warmup runs such batches for a first call's cost; these are timed. The cold start
        pays both (emulated_code.yaml: 40 + 120 ms on its 2 s load). Not for a model whose zeros
        cannot be made (Model.zeros: user code, inputs not all declared). A probe that fails is
        logged and left out (the replica serves); one that loses the device is told as a call's
        would be (on_lost) and False returned: the replica never serves; one past the request
        timeout fails the load, as a warm-up's does. Not counted as busy: no window holds it. The
        largest batch is timed at its second run but on an emulated model (a new shape's first
        call pays its kernels, plans and memory once); the 1-row batch after the warm-up's."""
        taken = []
        for rows in (1, largest):
            batch = self.model.zeros(rows)
            if isinstance(batch, str):
                log.info("model %s: batches not probed: %s", self.model.name, batch)
                return True
            # the warm-up ran 1 row; a new shape's first call pays its own kernels, plans and
            # memory, so the largest runs once untimed first (an emulated model's time is slept)
            runs = 2 if rows > 1 and not self.model.emulated else 1
            try:
                for _ in range(runs):
                    began = self._clock()
                    await asyncio.wait_for(self.executor.run_untimed(self.model.predict, batch), self.request_timeout_s)
            except asyncio.TimeoutError:
                raise RuntimeError(f"the model's batch of {rows} rows of zeros ran past the request timeout "
                                   f"({self.request_timeout_s:g} s)") from None
            except Exception as exc:
                if self._check_lost(exc):
                    return False
                log.warning("model %s: batches not probed: %d rows of zeros raised %s: %s", self.model.name, rows,
                            type(exc).__name__, str(exc).strip()[:300])
                return True
            taken.append((rows, self._clock() - began))
        for rows, seconds in taken:
            self.metrics.probed(rows, seconds)
        log.info("model %s: batches probed: %s", self.model.name,
                 ", ".join(f"{rows} row(s) in {seconds * 1000:.1f} ms" for rows, seconds in taken))
        return True

    def hung(self) -> str | None:
        """Why this replica is not live: its device was lost (a sticky CUDA error: every later
        call would fail), or one model call has run past the request timeout (its request was
        answered 504; the slice's thread is still inside the model)."""
        if self.lost is not None:
            return f"its device was lost: {self.lost}"
        stalled = self.executor.stalled_s()
        if stalled > self.request_timeout_s:
            return (f"the model has been inside one call for {stalled:.1f} s, past the request timeout "
                    f"({self.request_timeout_s:g} s)")
        return None

    async def stop(self) -> None:
        self.ready = False
        self.metrics.ready.set(0)
        await self._loop.stop()

    # ------------------------------------------------------------------ metadata

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "shoal", "version": __version__, "extensions": SERVER_EXTENSIONS}

    def check_model(self, name: str, version: str | None = None, need_ready: bool = True) -> Model:
        if name != self.model.name or (version is not None and version != self.model.version):
            raise ModelNotFound(name, version)
        if need_ready and not self.ready:
            raise ModelNotReady(name)
        return self.model

    def model_metadata(self, name: str, version: str | None, properties: dict[str, str]) -> dict[str, Any]:
        model = self.check_model(name, version)
        return {
            "name": model.name,
            "versions": [model.version],
            "platform": model.platform,
            "inputs": [s.to_json() for s in model.inputs],
            "outputs": [s.to_json() for s in model.outputs],
            "properties": {
                **properties,
                "emulated": "true" if model.emulated else "false",
                "max_batch_size": str(self._loop.spec.max_batch_size),
            },
        }

    # ------------------------------------------------------------------ V2

    def admit(self) -> None:
        """Answer 503 at once when the replica's queue is full, before reading a body."""
        self._loop.admit()

    async def infer(self, name: str, version: str | None, request: InferRequest) -> InferResponse:
        model = self.check_model(name, version)
        signature, rows = validate_request(request, model)
        future = self._loop.submit(request, rows, signature)
        outputs = await self._await_result(future)
        return InferResponse(
            model_name=model.name,
            model_version=model.version,
            id=request.id,
            outputs=select_outputs(outputs, request, model),
        )

    async def _await_result(self, future: asyncio.Future) -> Any:
        timer = asyncio.get_running_loop().call_later(self.request_timeout_s, _expire, future, self.request_timeout_s)
        try:
            return await future
        finally:
            timer.cancel()

    async def _execute(self, batch: list[Pending]) -> None:
        start = self._clock()
        for p in batch:
            self.metrics.queue_duration.observe(start - p.enqueued_at)
        self.metrics.batch_size.observe(sum(p.rows for p in batch))
        if isinstance(batch[0].payload, NativeV1Call):
            call = batch[0].payload
            return await self._run_one(batch[0], self.model.predict_v1, call.body, call.headers)
        if len(batch) == 1:
            return await self._run_one(batch[0], self.model.predict, merge_inputs([batch[0].payload]))
        try:
            outputs = await self.executor.run(self.model.predict, merge_inputs([p.payload for p in batch]))
            parts = split_outputs(outputs, [p.rows for p in batch])
        except Exception as exc:
            # One bad request, or outputs that do not split by rows, must not fail the
            # batch mates: run each alone.
            log.info("batch of %d failed (%s); running each request alone", len(batch), exc)
            for p in batch:
                await self._run_one(p, self.model.predict, merge_inputs([p.payload]))
            return
        for p, part in zip(batch, parts):
            _resolve(p.future, part)

    async def _run_one(self, pending: Pending, fn, *args) -> None:
        try:
            result = await self.executor.run(fn, *args)
        except Exception as exc:
            _resolve_error(pending.future, exc, self.model.name)
            self._check_lost(exc)
        else:
            _resolve(pending.future, result)

    def _check_lost(self, exc: Exception) -> bool:
        """Whether `exc` says the device is lost (executor.device_lost); the first time, the
        replica stops saying ready and on_lost is told (the replica exits to be replaced)."""
        lost = device_lost(exc)
        if lost is None:
            return False
        if self.lost is None:
            self.lost = lost
            self.metrics.ready.set(0)
            log.error("model %s lost its device: %s", self.model.name, lost)
            if self.on_lost is not None:
                self.on_lost(lost)
        return True

    # ------------------------------------------------------------------ V1

    async def predict_v1(self, name: str, body: Any, headers: dict[str, str]) -> Any:
        model = self.check_model(name)
        if not isinstance(body, dict) and not model.v1_any_json:
            raise InvalidInput(f"V1 request must be a JSON object with 'instances', got {type(body).__name__}")
        if model.has_native_v1:
            # through the same queue as V2: one limit, one timeout, one set of metrics
            call = NativeV1Call(body, headers)
            result = await self._await_result(self._loop.submit(call, 1, ("native-v1", id(call))))
            return result if isinstance(result, (dict, RawBody)) else {"predictions": result}
        request = v1_to_request(body, model)
        response = await self.infer(name, None, request)
        return {"predictions": v1_predictions(response.outputs, model)}

# ---------------------------------------------------------------------- pure helpers


@dataclass(frozen=True, slots=True, eq=False)
class NativeV1Call:
    """A V1 body for a model that answers V1 itself (a Nuclio handler, a KServe model)."""

    body: Any
    headers: dict[str, str]


def effective_batching(spec: BatchingSpec, model: Model) -> BatchingSpec:
    """Batching as configured, except off for a model whose tensors have no batch dimension."""
    if model.batchable or spec.max_batch_size == 1:
        return spec
    return BatchingSpec(max_batch_size=1, max_queue_requests=spec.max_queue_requests)


def validate_request(request: InferRequest, model: Model) -> tuple[tuple, int]:
    """Check a request against the model's declared inputs; returns the batching
    signature (input names, datatypes, non-batch dims) and the request's rows."""
    names = [t.name for t in request.inputs]
    if len(set(names)) != len(names):
        raise InvalidInput(f"input names must be unique, got {names}")
    if model.inputs:
        _check_declared(request.inputs, model)
    if model.outputs and request.outputs:
        known = [o.name for o in model.outputs]
        for out in request.outputs:
            if out.name not in known:
                raise InvalidInput(f"unknown output {out.name!r}; model {model.name!r} has outputs {known}")
    rows = request.rows
    if model.batchable:
        for t in request.inputs:
            if not t.shape or t.shape[0] != rows:
                raise InvalidInput(
                    f"inputs disagree on the batch dimension: {request.inputs[0].name!r} has {rows} rows, "
                    f"{t.name!r} has shape {list(t.shape)}"
                )
    signature = tuple(sorted((t.name, t.datatype, t.shape[1:]) for t in request.inputs))
    return signature, rows


def _check_declared(inputs: list[Tensor], model: Model) -> None:
    specs = {s.name: s for s in model.inputs}
    for t in inputs:
        spec = specs.get(t.name)
        if spec is None:
            raise InvalidInput(
                f"unknown input {t.name!r}; model {model.name!r} expects {_describe(model.inputs)}"
            )
        if t.datatype != spec.datatype:
            raise InvalidInput(
                f"input {t.name!r} has datatype {t.datatype} but model {model.name!r} expects {spec.datatype}"
            )
        if model.strict_shapes and not shape_matches(t.shape, spec.shape):
            raise InvalidInput(
                f"input {t.name!r} has shape {list(t.shape)} but model {model.name!r} expects "
                f"{list(spec.shape)} (-1 is any size)"
            )
    given = {t.name for t in inputs}
    missing = [s for s in model.inputs if s.name not in given]
    if missing:
        raise InvalidInput(f"missing input(s) {_describe(tuple(missing))} for model {model.name!r}")


def _describe(specs: tuple[TensorSpec, ...]) -> str:
    return ", ".join(f"{s.name!r} ({s.datatype} {list(s.shape)})" for s in specs)


def shape_matches(shape: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    return len(shape) == len(declared) and all(d == -1 or d == s for s, d in zip(shape, declared))


def merge_inputs(requests: list[InferRequest]) -> dict[str, np.ndarray]:
    """One request's inputs as they are, several concatenated along the batch dimension."""
    if len(requests) == 1:
        return {t.name: t.data for t in requests[0].inputs}
    names = [t.name for t in requests[0].inputs]
    by_name = [{t.name: t.data for t in r.inputs} for r in requests]
    return {n: np.concatenate([b[n] for b in by_name], axis=0) for n in names}


def split_outputs(outputs: dict[str, np.ndarray], rows: list[int]) -> list[dict[str, np.ndarray]]:
    """A batch's outputs cut back into each request's rows."""
    total = sum(rows)
    bounds = np.cumsum(rows)[:-1]
    parts: list[dict[str, np.ndarray]] = [{} for _ in rows]
    for name, arr in outputs.items():
        arr = np.asarray(arr)
        if arr.ndim == 0 or arr.shape[0] != total:
            raise ModelError(
                f"model output {name!r} has shape {list(arr.shape)}, not {total} rows for a batch of {total}"
            )
        for part, piece in zip(parts, np.split(arr, bounds)):
            part[name] = piece
    return parts


def select_outputs(outputs: dict[str, np.ndarray], request: InferRequest, model: Model) -> list[Tensor]:
    wanted = None if request.outputs is None else [o.name for o in request.outputs]
    names = wanted if wanted is not None else list(outputs)
    result = []
    for name in names:
        if name not in outputs:
            raise InvalidInput(f"unknown output {name!r}; model {model.name!r} produced {list(outputs)}")
        arr = np.asarray(outputs[name])
        result.append(Tensor(name, v2_datatype(arr.dtype), tuple(arr.shape), arr))
    return result


def v1_to_request(body: dict[str, Any], model: Model) -> InferRequest:
    """KServe V1 `instances` (or TF-style `inputs`) as a V2 request for a tensor model.
    One input: instances are its rows. Several: each instance maps input names to rows."""
    instances = body.get("instances", body.get("inputs"))
    if not isinstance(instances, list):
        raise InvalidInput("V1 request needs 'instances', a list of rows")
    if not model.inputs:
        raise InvalidInput(f"model {model.name!r} declares no inputs; use the V2 protocol")
    if len(model.inputs) == 1:
        return InferRequest(inputs=[_v1_tensor(instances, model.inputs[0])])
    tensors = []
    for spec in model.inputs:
        try:
            column = [row[spec.name] for row in instances]
        except (TypeError, KeyError):
            raise InvalidInput(
                f"model {model.name!r} has inputs {[s.name for s in model.inputs]}: each instance must be "
                f"an object with a value for each, e.g. {{{spec.name!r}: ...}}"
            ) from None
        tensors.append(_v1_tensor(column, spec))
    return InferRequest(inputs=tensors)


def _v1_tensor(rows: list, spec: TensorSpec) -> Tensor:
    dtype = numpy_dtype(spec.datatype)
    if spec.datatype == "BYTES":
        data = np.asarray([r.encode() if isinstance(r, str) else r for r in rows], dtype=np.object_)
    else:
        try:
            raw = np.asarray(rows)
        except ValueError:
            raise InvalidInput(f"instances for input {spec.name!r} are ragged; expected shape {list(spec.shape)}") from None
        data = cast_json_array(raw, spec.datatype, dtype, spec.name)
    return Tensor(spec.name, spec.datatype, tuple(data.shape), data)


def v1_predictions(outputs: list[Tensor], model: Model) -> Any:
    """V1 `predictions`: the model's V1 output, the only output, or one object per row."""
    by_name = {t.name: t.data for t in outputs}
    if model.v1_output and model.v1_output in by_name:
        return by_name[model.v1_output]
    if len(outputs) == 1:
        return outputs[0].data
    rows = outputs[0].data.shape[0] if outputs[0].data.ndim else 1
    return [{name: arr[i] for name, arr in by_name.items()} for i in range(rows)]


def _resolve(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _resolve_error(future: asyncio.Future, exc: BaseException, model: str) -> None:
    if future.done():
        return
    if not isinstance(exc, InferenceError):
        log.warning("model %s raised %s: %s", model, type(exc).__name__, exc)
        exc = ModelError(f"model {model!r} raised {type(exc).__name__}: {exc}")
    future.set_exception(exc)


def _expire(future: asyncio.Future, timeout_s: float) -> None:
    if not future.done():
        future.set_exception(InferenceTimeout(f"no result within the request timeout ({timeout_s:g} s)"))
