"""`MetricsSnapshot`: what a function looks like at one moment, the input of the policy's
`decide()`, built by each metrics source (direct scrapes, PromQL) and by the simulator. Pure,
and compiled with the policy by mypyc in the simulator (`autoscaler.native`), where one is
built for every function and tick: a `Record`, not a NamedTuple, for that.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from autoscaler.record import Record, set_once

NO_EXTRA: Final[Mapping[str, float]] = MappingProxyType({})  # read-only: one empty default shared by all


class MetricsSnapshot(Record):
    """What a function looks like at `at`: the input of `decide()`. Immutable."""

    def __init__(
        self, function: str, at: float, *,
        ready: int = 0,
        starting: int = 0,
        inflight: float = 0.0,  # inside replicas (queued or running)
        queued: float = 0.0,  # waiting in replicas' batch queues
        activator_queue: int = 0,  # held at the gateway, waiting for a replica
        duty: tuple[float, ...] = (),  # busy fraction per ready replica over the last window
        rps: float = 0.0,
        p95_s: float | None = None,
        cold_start_s: float | None = None,  # last measured, for cold-start-aware policies
        slice_fraction: float | None = None,  # the share of a device new replicas get now
        deployed_slice: float | None = None,  # the share its spec declares (slice hints aside)
        service_s: float | None = None,  # executor seconds per answered request over the window
        # latency of a batch by the requests in it on this function's slice, ((requests, seconds), ...),
        # the smallest first; learned from the replicas' batches (batch_window, learn_batch_latency).
        # Empty while unknown or for a model that does not batch.
        batch_latency_s: tuple[tuple[float, float], ...] = (),
        over_slo: float = 0.0,  # fraction of the window's answered requests slower than the function's SLO
        # requests per second the gateway answered over the window, held ones that timed out included:
        # what over_slo is a share of (rps counts a replica's, from its second scrape on)
        answered_rps: float = 0.0,
        window_s: float = 0.0,  # the seconds rps was measured over (0: unknown, e.g. between ticks)
        extra: Mapping[str, float] = NO_EXTRA,
    ) -> None:
        self.function: Final = function
        self.at: Final = at
        self.ready: Final = ready
        self.starting: Final = starting
        self.inflight: Final = inflight
        self.queued: Final = queued
        self.activator_queue: Final = activator_queue
        self.duty: Final = duty
        self.rps: Final = rps
        self.p95_s: Final = p95_s
        self.cold_start_s: Final = cold_start_s
        self.slice_fraction: Final = slice_fraction
        self.deployed_slice: Final = deployed_slice
        self.service_s: Final = service_s
        self.batch_latency_s: Final = batch_latency_s
        self.over_slo: Final = over_slo
        self.answered_rps: Final = answered_rps
        self.window_s: Final = window_s
        self.extra: Final = extra

    def __setattr__(self, name: str, value: object) -> None:
        set_once(self, name, value)  # its own, not inherited: see autoscaler.record

    @property
    def demand(self) -> float:
        """Requests wanting service now: inside replicas plus held at the gateway."""
        return self.inflight + self.activator_queue
