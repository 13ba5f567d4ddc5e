"""A small open-loop load generator for the chaos tests: requests go out on a schedule
whatever the answers do, bounded in count, in time and in concurrency, and every one
ends as a status, a client timeout ("hung") or a connection error; none is dropped.

It speaks HTTP/1.1 over pooled keep-alive connections (serving.upstream.UpstreamPool),
which costs a fraction of what httpx does per request, so a 2-core machine can offer
hundreds of requests a second next to the platform it measures.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from serving.upstream import UpstreamPool, UpstreamUnavailable


@dataclass(frozen=True, slots=True)
class Outcome:
    function: str
    sent_at: float  # seconds since the run started
    latency_s: float
    status: int | None  # None: no HTTP answer at all
    error: str = ""  # "hung" (client timeout), "not sent" (concurrency bound) or the connection error
    retry_after: str | None = None


@dataclass
class Load:
    """Open-loop requests to `functions` at `rate` each, until stop() or `seconds`."""

    host: str
    port: int
    body: bytes
    timeout_s: float = 40.0
    max_outstanding: int = 512
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._pool = UpstreamPool(self.host, self.port, max_idle=self.max_outstanding)
        self._outstanding = 0
        self._stop = asyncio.Event()
        self.t0 = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    async def run(self, function: str, rate: float, seconds: float, start_s: float = 0.0) -> None:
        """`rate` requests a second to `function` from `start_s` for `seconds` (since t0)."""
        tasks: set[asyncio.Task] = set()
        n = int(rate * seconds)
        for i in range(n):
            at = self.t0 + start_s + i / rate
            pause = at - time.monotonic()
            if pause > 0:
                try:
                    await asyncio.wait_for(self._stop.wait(), pause)
                    break
                except asyncio.TimeoutError:
                    pass
            if self._stop.is_set():
                break
            if self._outstanding >= self.max_outstanding:
                self.outcomes.append(Outcome(function, time.monotonic() - self.t0, 0.0, None, "not sent"))
                continue
            task = asyncio.get_running_loop().create_task(self._one(function))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks)

    async def _one(self, function: str) -> None:
        self._outstanding += 1
        sent = time.monotonic()
        status, error, retry_after = None, "", None
        try:
            response = await self._pool.request(
                "POST", f"/v2/models/{function}/infer", [(b"content-type", b"application/json")], self.body,
                self.timeout_s)
            status = response.status
            retry_after = dict(response.headers).get(b"retry-after", b"").decode() or None
            if status != 200:
                error = json.loads(response.body).get("error", "") if response.body else ""
        except asyncio.TimeoutError:
            error = "hung"
        except (UpstreamUnavailable, OSError) as exc:
            error = f"connection: {exc}"
        finally:
            self._outstanding -= 1
        self.outcomes.append(Outcome(function, sent - self.t0, time.monotonic() - sent, status, error, retry_after))

    def close(self) -> None:
        self._pool.close()


def v2_body(name: str, shape: list[int]) -> bytes:
    count = 1
    for d in shape:
        count *= d
    return json.dumps({"inputs": [{"name": name, "shape": shape, "datatype": "FP32", "data": [0.5] * count}]}).encode()


def summary(outcomes: list[Outcome]) -> dict:
    """Counts by status (or error kind) and the latency quantiles of the 200s."""
    by: dict[str, int] = {}
    for o in outcomes:
        key = str(o.status) if o.status is not None else o.error.split(":", 1)[0]
        by[key] = by.get(key, 0) + 1
    ok = sorted(o.latency_s for o in outcomes if o.status == 200)

    def q(p: float) -> float | None:
        return ok[min(len(ok) - 1, int(p * len(ok)))] if ok else None

    return {"total": len(outcomes), "by": by, "p50_s": q(0.5), "p99_s": q(0.99)}
