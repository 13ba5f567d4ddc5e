"""Cold starts as the control loop measures them, per function (pure: the caller gives the times).

From the tick that raised a function's replicas to the first tick that sees that many ready (the
pods' scheduling, image pull, start and model load; to within a tick). Each raise is measured on
its own, so a second one while the first is starting reads its own time. The latest is what the
policy reads as the function's cold start (its forecast looks that far ahead). Fewer ready than
asked without a raise (a pod restarting, a readiness probe failing, a Deployment a new leader finds
mid-scale) is no cold start; a wait longer than MAX_S is a wait for capacity (pods Pending on a full
cluster), not one either. A scaler that times a start itself (shoal up's backend, create to ready)
reports that instead (`loop.Fleet.started_s`). Imports nothing but the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ColdStarts:
    MAX_S = 900.0

    pending: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # function -> [(asked at, replicas)]
    latest: dict[str, float] = field(default_factory=dict)

    def observe(self, function: str, now: float, ready: int) -> None:
        """A tick saw `ready` replicas ready: the raises they complete are measured."""
        steps = self.pending.get(function)
        if not steps:
            return
        for asked_at, target in steps:
            if ready >= target and 0.0 <= now - asked_at <= self.MAX_S:
                self.latest[function] = now - asked_at
        left = [(at, target) for at, target in steps if ready < target and now - at <= self.MAX_S]
        if left:
            self.pending[function] = left
        else:
            del self.pending[function]

    def ask(self, function: str, now: float, desired: int, replicas: int, ready: int) -> None:
        """This tick asks for `desired` replicas where the scaler has `replicas`, `ready` of
        them ready: a raise starts a measurement; asking for fewer caps the running ones (they
        wait for what is still asked), and for no more than are ready ends them."""
        steps = [(at, min(target, desired)) for at, target in self.pending.get(function, []) if desired > ready]
        if desired > replicas and desired > ready:
            steps.append((now, desired))
        if steps:
            self.pending[function] = steps
        else:
            self.pending.pop(function, None)

    def keep_only(self, functions: set[str]) -> None:
        """Forget functions that are gone (a name deployed again later starts afresh)."""
        forget_others(functions, self.pending, self.latest)

    def clear(self) -> None:
        self.pending.clear()
        self.latest.clear()


def forget_others(keep: set[str], *tables: dict[str, Any]) -> None:
    """Drop every entry whose function is not in `keep`, from each table, in place."""
    for table in tables:
        for name in [n for n in table if n not in keep]:
            del table[name]
