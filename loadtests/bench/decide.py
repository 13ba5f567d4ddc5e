"""Micro-benchmark: what one look at a busy function costs, a MetricsSnapshot built and
Shoal's decide() called, the unit of work of the controller and of the simulator's scale run.

    python -m loadtests.bench.decide [--looks 20000] [--repeat 15]

Prints the best of `repeat` loops of `looks` successive looks at one steady function (3
replicas, 1,000 requests/s swinging by up to 18 %, 1 ms each), in microseconds per look:
policy.py interpreted, and compiled by mypyc (autoscaler.native) where the checkout has it.
Run it from another checkout's root to compare commits (`cd <worktree> && python
/path/to/decide.py`): the interpreted look uses only what every version of the policy has.
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path.cwd()))  # the checkout it is run from, for comparing commits

from autoscaler import policy  # noqa: E402


def looks(n: int, module: ModuleType = policy) -> None:
    """`n` looks through `module`'s decide(): policy.py, or policy.py compiled."""
    state, config = module.PolicyState(), module.PolicyConfig()
    # the classes its decide() takes (compiled with it, or not)
    snapshot_type, spec = module.MetricsSnapshot, module.ScalingSpec(slo_p95_ms=50.0, target_concurrency=2.0)
    for t in range(n):
        snapshot = snapshot_type("f", float(t), ready=3, inflight=1.0, duty=(0.3,) * 3, rps=1000.0 + (t % 7) * 30,
                                   p95_s=0.004, service_s=0.001, cold_start_s=2.0, slice_fraction=0.125)
        _, state = module.decide(snapshot, spec, state, float(t), config)


def best_us(n: int = 20000, repeat: int = 15, module: ModuleType = policy) -> float:
    """Microseconds per look, the best of `repeat` loops of `n` looks."""
    return min(timeit.repeat(lambda: looks(n, module), number=1, repeat=repeat)) / n * 1e6


def compiled() -> ModuleType | None:
    """policy.py compiled by mypyc, where this checkout has autoscaler.native and it builds."""
    try:
        from autoscaler import native
    except ImportError:
        return None
    try:
        return native.load_group(native.POLICY_GROUP)[native.POLICY_GROUP.index("autoscaler.policy")]
    except native.CompileError as error:
        print(f"policy.py not compiled: {error}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--looks", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    per_look = best_us(args.looks, args.repeat)
    print(f"snapshot + decide(), interpreted: {per_look:.2f} us per look (best of {args.repeat} x {args.looks})")
    module = compiled()
    if module is not None:
        fast = best_us(args.looks, args.repeat, module)
        print(f"snapshot + decide(), compiled (mypyc): {fast:.2f} us per look, {per_look / fast:.2f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
