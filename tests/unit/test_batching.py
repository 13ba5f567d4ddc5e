"""The batch planner, table-driven on a fake clock: `now` is just a number."""

from __future__ import annotations

import pytest

from functions.spec import BatchingSpec
from serving.batching import BatchPlan, plan_batch

MAX8 = BatchingSpec(max_batch_size=8, max_queue_delay_ms=10)
PREF = BatchingSpec(max_batch_size=8, max_queue_delay_ms=10, preferred_batch_sizes=(4,))
NODELAY = BatchingSpec(max_batch_size=8, max_queue_delay_ms=0)
NOBATCH = BatchingSpec(max_batch_size=1)

CASES = [
    # id, rows, oldest_at, now, spec, backlog, expected
    ("empty-queue", [], 0.0, 0.0, MAX8, False, BatchPlan(0, 0, None, "empty")),
    ("batching-off-takes-one", [1, 1, 1], 0.0, 0.0, NOBATCH, False, BatchPlan(1, 1, None, "single")),
    # 8 single-row requests: 1+1+...+1 = 8 = max_batch_size -> full at once
    ("eight-rows-fill-a-batch", [1] * 8, 0.0, 0.0, MAX8, False, BatchPlan(8, 8, None, "full")),
    # 5+2 = 7 fits, 7+3 = 10 > 8 -> the 3-row request waits: a full batch of 7 now
    ("next-request-does-not-fit", [5, 2, 3], 0.0, 0.0, MAX8, False, BatchPlan(2, 7, None, "full")),
    # a 12-row request is bigger than max 8: it runs alone rather than never
    ("oversized-head-runs-alone", [12, 1], 0.0, 0.0, MAX8, False, BatchPlan(1, 12, None, "full")),
    # 3 rows, delay 10 ms, oldest at t=0, now t=0.004 -> wait until 0 + 0.010
    ("partial-waits-for-delay", [1, 1, 1], 0.0, 0.004, MAX8, False, BatchPlan(0, 0, 0.010, "waiting")),
    # now = 0.010 = 0 + 10 ms: the delay is spent -> run the 3 rows
    ("delay-expired-runs-partial", [1, 1, 1], 0.0, 0.010, MAX8, False, BatchPlan(3, 3, None, "delay")),
    # 2+2 = 4 is a preferred size -> run now, no wait
    ("preferred-size-runs-at-once", [2, 2], 0.0, 0.001, PREF, False, BatchPlan(2, 4, None, "preferred")),
    # 2+1 = 3 is not preferred and the delay is not spent -> wait
    ("non-preferred-waits", [2, 1], 0.0, 0.001, PREF, False, BatchPlan(0, 0, 0.010, "waiting")),
    # zero delay: whatever is there runs now
    ("zero-delay-runs-now", [1, 1], 5.0, 5.0, NODELAY, False, BatchPlan(2, 2, None, "delay")),
    # incompatible requests wait behind: waiting would only delay them -> run now
    ("backlog-forces-run", [1, 1], 0.0, 0.001, MAX8, True, BatchPlan(2, 2, None, "full")),
    # zero-row requests add nothing: 0+0 = 0 rows is neither full nor preferred -> wait
    ("zero-rows-wait", [0, 0], 0.0, 0.0, MAX8, False, BatchPlan(0, 0, 0.010, "waiting")),
    # 4+4 = 8 is both the limit and a preferred size: "full" is decided first
    ("limit-also-preferred", [4, 4], 0.0, 0.0, BatchingSpec(max_batch_size=8, preferred_batch_sizes=(8,)), False,
     BatchPlan(2, 8, None, "full")),
]


@pytest.mark.parametrize(
    "rows,oldest_at,now,spec,backlog,expected",
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_plan_batch(rows, oldest_at, now, spec, backlog, expected):
    assert plan_batch(rows, oldest_at, now, spec, backlog) == expected
