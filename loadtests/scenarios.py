"""Load-test scenarios as open-loop arrival schedules (pure: numpy and autoscaler.traces).
`make_schedule(scenario, ...)` fixes every request's send time and function before the run, so
an overloaded server cannot slow the offered load down and hide its own overload as a closed
loop of users would, and a seed gives the same schedule, so two runs to compare offer the same
requests. The scenarios and their options are in docs/loadtests.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autoscaler.traces import make_trace

SCENARIOS: tuple[str, ...] = ("steady", "step", "spike", "diurnal", "gamma", "zero-cycle", "longtail", "csv")
MAX_ARRIVALS = 2_000_000  # a load test from one process: beyond this the schedule itself is the mistake


@dataclass(frozen=True)
class Schedule:
    """`times` (seconds from the start, ascending) and `fids` (index into `functions`)."""

    scenario: str
    functions: tuple[str, ...]
    duration_s: float
    times: np.ndarray
    fids: np.ndarray
    params: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.times.size)

    def offered_per_s(self, bins: int | None = None) -> np.ndarray:
        """Requests scheduled in each whole second of the run."""
        n = bins if bins is not None else max(1, math.ceil(self.duration_s))
        idx = np.minimum(self.times.astype(np.int64), n - 1)
        return np.bincount(idx, minlength=n)[:n]

    def users_at(self, users: int, t: float, smooth_s: int = 5) -> int:
        """A closed loop's user count at `t`: `users` times the offered rate there over its peak,
        both as moving averages over `smooth_s` seconds (so Poisson noise does not make users come and go)."""
        per_s = self.offered_per_s().astype(float)
        if per_s.max() <= 0:
            return 0
        width = min(smooth_s, per_s.size)
        level = np.convolve(per_s, np.ones(width) / width, mode="same")
        return int(math.ceil(users * level[min(max(int(t), 0), level.size - 1)] / level.max() - 1e-9))

    def per_function(self) -> dict[str, int]:
        counts = np.bincount(self.fids, minlength=len(self.functions))
        return {name: int(c) for name, c in zip(self.functions, counts)}

    def describe(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "functions": list(self.functions), "duration_s": self.duration_s,
                "requests": len(self), "mean_rate": len(self) / self.duration_s,
                "peak_1s": int(self.offered_per_s().max()) if len(self) else 0, "params": self.params}


def make_schedule(scenario: str, *, functions: list[str] | tuple[str, ...], duration_s: float, rate: float,
                  seed: int = 0, base_rate: float | None = None, spike_at_s: float | None = None,
                  spike_s: float | None = None, step_x: float = 4.0, swing: float = 4.0, cv: float = 2.0,
                  burst_s: float | None = None, idle_s: float | None = None, zipf_s: float = 1.1,
                  path: str | None = None) -> Schedule:
    """The arrival schedule of `scenario`; ValueError names the bad value and what is allowed."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; allowed: {', '.join(SCENARIOS)}")
    functions = tuple(functions)
    if not functions or any(not f for f in functions):
        raise ValueError("give at least one function name")
    if scenario != "longtail" and scenario != "csv" and len(functions) != 1:
        raise ValueError(f"scenario {scenario!r} drives one function; got {len(functions)} (longtail takes several)")
    if not (isinstance(duration_s, (int, float)) and math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s={duration_s!r}: must be a number > 0")
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate={rate!r}: must be a number of requests per second > 0")
    if scenario != "csv" and rate * duration_s > MAX_ARRIVALS:
        raise ValueError(f"rate {rate:g}/s for {duration_s:g} s is over {MAX_ARRIVALS:,} requests")
    T = float(duration_s)
    params: dict[str, Any] = {"rate": rate, "seed": seed}

    if scenario == "steady":
        parts = [_poisson(rate, T, seed)]
    elif scenario == "gamma":
        trace = make_trace("gamma", seconds=T, seed=seed, rate=rate, cv=cv)
        parts, params["cv"] = [trace.times], cv
    elif scenario == "step":
        trace = make_trace("step", seconds=T, seed=seed, rate=rate / step_x, step_x=step_x, step_at_s=T / 2)
        parts, params["step_x"] = [trace.times], step_x
    elif scenario == "diurnal":
        a = (swing - 1.0) / (swing + 1.0)  # peak = mean * (1 + a)
        trace = make_trace("diurnal", seconds=T, seed=seed, rate=rate / (1 + a), swing=swing, period_s=T,
                           phase=-math.pi / 2)  # from the trough
        parts, params["swing"] = [trace.times], swing
    elif scenario == "spike":
        base = rate / 10 if base_rate is None else base_rate
        at = T / 4 if spike_at_s is None else spike_at_s
        width = T / 4 if spike_s is None else spike_s
        if not (0 <= base <= rate) or not (0 <= at < T) or width <= 0:
            raise ValueError(f"spike needs 0 <= base_rate ({base}) <= rate ({rate}), 0 <= spike_at_s ({at}) "
                             f"< duration ({T}) and spike_s ({width}) > 0")
        width = min(width, T - at)
        parts = [_poisson(rate - base, width, seed + 1) + at]
        if base > 0:
            parts.append(_poisson(base, T, seed))
        params.update(base_rate=base, spike_at_s=at, spike_s=width)
    elif scenario == "zero-cycle":
        burst = T / 4 if burst_s is None else burst_s
        idle = T - 2 * burst if idle_s is None else idle_s
        if burst <= 0 or idle < 0 or 2 * burst + idle > T + 1e-9:
            raise ValueError(f"zero-cycle needs 2 x burst_s ({burst}) + idle_s ({idle}) <= duration ({T})")
        parts = [_poisson(rate, burst, seed), _poisson(rate, burst, seed + 1) + burst + idle]
        params.update(burst_s=burst, idle_s=idle)
    elif scenario == "longtail":  # the simulator's zipf trace: a seed gives it the same arrivals
        trace = make_trace("zipf", functions=len(functions), seconds=T, seed=seed, total_rate=rate, zipf=zipf_s)
        weights = trace.rates / trace.rates.sum()
        params.update(zipf_s=zipf_s, weights=[round(float(w), 6) for w in weights])
        return Schedule(scenario, functions, T, trace.times, trace.fids.astype(np.int32), params)
    else:  # csv
        if not path:
            raise ValueError("scenario csv needs a path (--trace FILE)")
        trace = make_trace("csv", path=path, seconds=T)
        params = {"path": str(path)}
        names = trace.functions
        if names == ("f0000",):  # one column: every request to the first function given
            return Schedule(scenario, functions[:1], T, np.asarray(trace.times), np.zeros(len(trace), np.int32), params)
        unknown = sorted(set(names) - set(functions))
        if unknown:
            raise ValueError(f"{path}: functions {unknown} are not among --function {list(functions)}")
        remap = np.array([functions.index(n) for n in names], np.int32)
        return Schedule(scenario, functions, T, np.asarray(trace.times), remap[trace.fids], params)

    times = np.sort(np.concatenate(parts))
    times = times[times < T]
    return Schedule(scenario, functions, T, times, np.zeros(times.size, np.int32), params)


def _poisson(rate: float, seconds: float, seed: int) -> np.ndarray:
    if rate <= 0 or seconds <= 0:
        return np.zeros(0)
    return np.asarray(make_trace("poisson", seconds=seconds, seed=seed, rate=rate).times)
