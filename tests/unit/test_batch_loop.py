"""The asyncio batch loop and the DataPlane's batch execution, with fake models (no servers)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from functions.spec import BatchingSpec, SliceRequest
from serving.batch_loop import BatchLoop
from serving.dataplane import DataPlane
from serving.executor import SliceExecutor, bind_slice
from serving.metrics import ReplicaMetrics
from serving.models.base import LoadOptions, Model
from serving.protocol.errors import InvalidInput, Overloaded
from serving.protocol.types import InferRequest, Tensor, TensorSpec


def test_caller_that_gives_up_leaves_the_queue():
    async def scenario():
        gate = asyncio.Event()

        async def execute(batch):
            await gate.wait()
            for p in batch:
                p.future.set_result("done")

        loop = BatchLoop(BatchingSpec(max_batch_size=1, max_queue_requests=3), execute)
        loop.start()
        first = loop.submit("a", 1, "s")
        await asyncio.sleep(0)  # the loop takes "a" and blocks in execute
        waiting = [loop.submit(x, 1, "s") for x in "bcd"]
        assert len(loop) == 3
        with pytest.raises(Overloaded):
            loop.submit("e", 1, "s")  # 3 waiting = max_queue_requests
        waiting[1].cancel()  # "c" times out or its client goes away
        await asyncio.sleep(0)  # done callbacks run on the next turn of the event loop
        assert len(loop) == 2
        loop.submit("e", 1, "s")  # room again
        gate.set()
        assert await first == "done" and await waiting[0] == "done" and await waiting[2] == "done"
        await loop.stop()

    asyncio.run(scenario())


def test_incompatible_requests_are_not_batched_together():
    async def scenario():
        batches = []

        async def execute(batch):
            batches.append([p.payload for p in batch])
            for p in batch:
                p.future.set_result(None)

        loop = BatchLoop(BatchingSpec(max_batch_size=8, max_queue_delay_ms=50), execute)
        futures = [loop.submit(x, 1, sig) for x, sig in [("a1", "A"), ("a2", "A"), ("b1", "B"), ("a3", "A")]]
        loop.start()
        await asyncio.gather(*futures)
        await loop.stop()
        return batches

    # a1+a2 share a signature; b1 breaks the run, so a3 waits for the next batch;
    # a backlog behind the head means no waiting for the 50 ms delay
    assert asyncio.run(scenario()) == [["a1", "a2"], ["b1"], ["a3"]]


class EchoModel(Model):
    """Doubles its input; fails on a NaN row; optionally adds an output with no batch rows."""

    def __init__(self, scalar_output: bool = False):
        super().__init__("echo", "/dev/null", LoadOptions())
        self.inputs = (TensorSpec("x", "FP32", (-1, 2)),)
        self.outputs = (TensorSpec("y", "FP32", (-1, 2)),)
        self.batchable = True
        self.scalar_output = scalar_output
        self.calls: list[int] = []

    def load(self):
        pass

    def predict(self, inputs):
        x = inputs["x"]
        self.calls.append(len(x))
        if np.isnan(x).any():
            raise InvalidInput("NaN in x")
        out = {"y": x * 2}
        if self.scalar_output:
            out["total"] = np.float32(x.sum())
        return out


def _request(value: float) -> InferRequest:
    x = np.full((1, 2), value, dtype=np.float32)
    return InferRequest(inputs=[Tensor("x", "FP32", (1, 2), x)])


def _dataplane(model: Model) -> DataPlane:
    binding = bind_slice(SliceRequest(), "cpu", None, 1)
    metrics = ReplicaMetrics("echo", binding.labels())
    spec = BatchingSpec(max_batch_size=8, max_queue_delay_ms=20)
    return DataPlane(model, SliceExecutor(binding), metrics, spec)


async def _run_concurrently(dp: DataPlane, values: list[float]):
    await dp.load()
    results = await asyncio.gather(*(dp.infer("echo", None, _request(v)) for v in values), return_exceptions=True)
    await dp.stop()
    return results


def test_one_bad_request_does_not_fail_its_batch_mates():
    model = EchoModel()
    results = asyncio.run(_run_concurrently(_dataplane(model), [1.0, float("nan"), 3.0]))
    assert isinstance(results[1], InvalidInput)
    assert results[0].outputs[0].data.tolist() == [[2.0, 2.0]]
    assert results[2].outputs[0].data.tolist() == [[6.0, 6.0]]
    # the warm-up's one row and the probe's batches of 1 and 8 (twice: timed at its second) at
    # load; one batch of 3 failed, then each request ran alone
    assert model.calls == [1, 1, 8, 8, 3, 1, 1, 1]


def test_outputs_that_do_not_split_by_rows_fall_back_to_one_by_one():
    model = EchoModel(scalar_output=True)
    results = asyncio.run(_run_concurrently(_dataplane(model), [1.0, 2.0]))
    assert [r.outputs[0].data.tolist() for r in results] == [[[2.0, 2.0]], [[4.0, 4.0]]]
    # the batch's scalar 'total' (1+1+2+2 = 6) could not be cut per request; alone each is right
    assert [float(r.outputs[1].data) for r in results] == [2.0, 4.0]
    assert model.calls == [1, 1, 8, 8, 2, 1, 1]  # the warm-up's one row, the probe's 1 and 8 (twice) first


class WarmUpModel(EchoModel):
    """EchoModel that records what each call got, and fails or stalls at its first call as told."""

    def __init__(self, fail: Exception | None = None, emulated: bool = False, shape: tuple = (-1, 2),
                 user_code: bool = False, stall_s: float = 0.0):
        super().__init__()
        self.seen: list[np.ndarray] = []
        self.fail, self.stall_s = fail, stall_s
        self.emulated, self.user_code = emulated, user_code
        self.inputs = (TensorSpec("x", "FP32", shape),)

    def predict(self, inputs):
        self.seen.append(inputs["x"].copy())
        if len(self.seen) == 1:
            time.sleep(self.stall_s)
            if self.fail is not None:
                raise self.fail
        return super().predict(inputs)


def test_a_model_runs_one_row_of_zeros_before_it_serves():
    """Model.warm_up at load: one row of zeros of the declared shape (-1, 2), on the slice's thread,
    before the replica is ready; its time is no serving (the busy seconds stay 0); then requests."""
    model = WarmUpModel()
    dp = _dataplane(model)

    async def scenario():
        await dp.load()
        ready, busy = dp.ready, dp.executor.busy_seconds()
        result = await dp.infer("echo", None, _request(2.0))
        await dp.stop()
        return ready, busy, result

    ready, busy, result = asyncio.run(scenario())
    assert ready and busy == 0.0
    assert model.seen[0].shape == (1, 2) and model.seen[0].dtype == np.float32 and not model.seen[0].any()
    # then the probe's batches of 1 and 8 rows (max_batch_size, timed at its second run), then the request
    assert result.outputs[0].data.tolist() == [[4.0, 4.0]] and model.calls == [1, 1, 8, 8, 1]


@pytest.mark.parametrize("model, calls", [
    pytest.param(WarmUpModel(emulated=True), [1, 8], id="emulated: its time is slept, its batches probed"),
    pytest.param(WarmUpModel(user_code=True), [], id="a handler: called only for a request"),
    pytest.param(WarmUpModel(shape=(-1, -1)), [], id="a free dim past the batch's"),
    pytest.param(WarmUpModel(fail=InvalidInput("zeros are no image")), [1], id="refuses zeros: still serves"),
])
def test_a_model_not_warmed_up_still_serves(model, calls, caplog):
    dp = _dataplane(model)

    async def scenario():
        await dp.load()
        result = await dp.infer("echo", None, _request(1.0))
        await dp.stop()
        return result

    assert asyncio.run(scenario()).outputs[0].data.tolist() == [[2.0, 2.0]]
    assert [len(x) for x in model.seen] == calls + [1]
    if model.fail is not None:  # a refusal is a warning: replicas log at warning by default
        assert "not warmed up: it raised InvalidInput: zeros are no image" in caplog.text


def test_a_warm_up_that_loses_the_device_is_told_as_a_call_would_be():
    """A sticky CUDA error in the warm-up (executor.device_lost): the replica is told (on_lost: it
    exits with status 4, to be replaced) and never serves."""
    dp = _dataplane(WarmUpModel(fail=RuntimeError("CUDA error: an illegal memory access was encountered")))
    told: list[str] = []
    dp.on_lost = told.append
    asyncio.run(dp.load())
    assert not dp.ready and told == ["CUDA error: an illegal memory access was encountered"] and dp.lost == told[0]


def test_a_warm_up_past_the_request_timeout_fails_the_load():
    binding = bind_slice(SliceRequest(), "cpu", None, 1)
    dp = DataPlane(WarmUpModel(stall_s=0.5), SliceExecutor(binding), ReplicaMetrics("echo", binding.labels()),
                   BatchingSpec(max_batch_size=8), request_timeout_s=0.1)
    with pytest.raises(RuntimeError, match=r"the model's warm-up ran past the request timeout \(0.1 s\)"):
        asyncio.run(dp.load())
    assert not dp.ready
