"""The asyncio loop that drives the pure batch planner (serving/batching.py). Requests wait in one
FIFO; the loop asks the planner about the run of requests at its head that can share a batch,
then executes a batch or sleeps until the planner's wake time or the next arrival. Batches run
one at a time (a slice is one stream of work), and while one runs the next fills, which is where
batching pays under load. Each request's future resolves with its own rows.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Hashable

from functions.spec import BatchingSpec
from serving.batching import plan_batch
from serving.protocol.errors import Overloaded


@dataclass(slots=True, eq=False)  # compared by identity: the queue removes exact entries
class Pending:
    payload: Any
    rows: int
    signature: Hashable
    enqueued_at: float
    future: asyncio.Future = field(repr=False)
    taken: bool = False  # popped into a batch


Execute = Callable[[list[Pending]], Awaitable[None]]


class BatchLoop:
    def __init__(self, spec: BatchingSpec, execute: Execute, clock: Callable[[], float] = time.monotonic):
        self.spec = spec
        self._execute = execute
        self._clock = clock
        self._queue: collections.deque[Pending] = collections.deque()
        self._arrived = asyncio.Event()
        self._task: asyncio.Task | None = None

    def __len__(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="batch-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def set_spec(self, spec: BatchingSpec) -> None:
        self.spec = spec

    def admit(self) -> None:
        """Refuse at once when the queue is full (before a body is even read)."""
        if len(self._queue) >= self.spec.max_queue_requests:
            raise Overloaded(
                f"replica queue is full ({self.spec.max_queue_requests} requests waiting); retry later"
            )

    def submit(self, payload: Any, rows: int, signature: Hashable) -> asyncio.Future:
        """Queue a request; its future resolves with the executor's result for its rows.
        A caller that gives up (timeout, cancellation) leaves the queue at once."""
        self.admit()
        future = asyncio.get_running_loop().create_future()
        pending = Pending(payload, rows, signature, self._clock(), future)
        future.add_done_callback(lambda _f, p=pending: self._drop(p))
        self._queue.append(pending)
        self._arrived.set()
        return future

    def _drop(self, pending: Pending) -> None:
        if not pending.taken:
            try:
                self._queue.remove(pending)
            except ValueError:
                pass

    def _head_run(self) -> list[Pending]:
        """The compatible requests at the head of the queue (callers that gave up have
        already left it)."""
        if not self._queue:
            return []
        head = self._queue[0].signature
        limit = self.spec.max_batch_size + 1  # one past the limit tells the planner it is full
        run = []
        for pending in self._queue:
            if pending.signature != head or len(run) >= limit:
                break
            run.append(pending)
        return run

    async def _run(self) -> None:
        while True:
            run = self._head_run()
            if not run:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            now = self._clock()
            plan = plan_batch(
                [p.rows for p in run], run[0].enqueued_at, now, self.spec,
                backlog=len(self._queue) > len(run),
            )
            if plan.take == 0:
                await self._sleep_until(plan.wake_at, now)
                continue
            batch = run[: plan.take]
            for _ in batch:  # the batch is the head of the queue
                self._queue.popleft().taken = True
            try:
                await self._execute(batch)
            except Exception as exc:  # the executor resolves futures itself; this is a safety net
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)

    async def _sleep_until(self, wake_at: float | None, now: float) -> None:
        self._arrived.clear()
        timeout = None if wake_at is None else max(0.0, wake_at - now)
        try:
            await asyncio.wait_for(self._arrived.wait(), timeout)
        except asyncio.TimeoutError:
            pass
