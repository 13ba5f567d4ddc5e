"""The dynamic batch planner, a pure function of the queue and `now` (like Triton's dynamic
batcher): given the rows of the requests at the head of the queue that can share a batch (same
inputs, datatypes and non-batch dimensions), it says how many to run now, or when to look again.
It imports no asyncio and reads no clock: the asyncio loop that drives it is serving/batch_loop.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from functions.spec import BatchingSpec


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """`take` requests from the head of the queue now (`rows` rows in all), or, when
    `take` is 0, nothing until `wake_at` (None: until a request arrives)."""

    take: int
    rows: int
    wake_at: float | None
    reason: str


EMPTY = BatchPlan(0, 0, None, "empty")


def plan_batch(
    rows: Sequence[int],
    oldest_at: float,
    now: float,
    spec: BatchingSpec,
    backlog: bool = False,
) -> BatchPlan:
    """The next batch from the rows of the compatible requests at the head of the queue, oldest
    first (the head enqueued at `oldest_at`); `backlog`: other requests wait behind these."""
    if not rows:
        return EMPTY
    limit = spec.max_batch_size
    if limit == 1 or rows[0] >= limit:  # the head alone fills a batch: it runs alone
        return BatchPlan(1, rows[0], None, "single" if limit == 1 else "full")
    take, total = _fit(rows, limit)
    if total == limit or take < len(rows) or backlog:  # a full batch, or more wait behind it
        return BatchPlan(take, total, None, "full")
    if total in spec.preferred_batch_sizes:
        return BatchPlan(take, total, None, "preferred")
    deadline = oldest_at + spec.max_queue_delay_s
    if now >= deadline:  # the oldest request has waited max_queue_delay: run what fits
        return BatchPlan(take, total, None, "delay")
    return BatchPlan(0, 0, deadline, "waiting")  # a new arrival wakes the planner earlier


def _fit(rows: Sequence[int], limit: int) -> tuple[int, int]:
    """How many requests from the head fit in `limit` rows, and their rows."""
    take = total = 0
    for r in rows:
        if total + r > limit:
            break
        take += 1
        total += r
    return take, total
