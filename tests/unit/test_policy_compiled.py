"""policy.py compiled by mypyc (autoscaler.native) against policy.py as the interpreter runs it.

The two are one source; these tests show the compiler kept its meaning: every look of seeded
random walks of one function (counts, traffic, silences, timers, batch tables, clock steps)
under several configs gives the same decision, detail included, and the same state, field by
field; whole simulations give the same record. And the build cache never serves a build of
another source."""

from __future__ import annotations

import importlib
import sys
import textwrap
import warnings

import numpy as np
import pytest

from autoscaler import native
from autoscaler import looks as interpreted_looks
from autoscaler import policy as interpreted
from autoscaler import simulator as S
from autoscaler.snapshot import MetricsSnapshot
from autoscaler.policy import PolicyConfig
from autoscaler.traces import make_trace
from functions.spec import ScalingSpec

try:
    _, compiled_spec, compiled_snapshot, compiled, compiled_looks = native.load_group(native.POLICY_GROUP)
except native.CompileError as error:  # pragma: no cover - mypyc and a C compiler are dev dependencies
    if ": error:" in str(error):
        # mypy refused policy.py or looks.py: a defect of the source, not a missing tool (the simulator
        # would run them interpreted, several times slower, with only a warning)
        raise
    pytest.skip(f"policy.py could not be compiled: {error}", allow_module_level=True)

TABLES = ((), ((1.0, 0.004), (8.0, 0.006), (32.0, 0.014)), ((1.0, 0.02), (4.0, 0.05)))
CONFIGS = (
    PolicyConfig(),
    PolicyConfig(concurrency_window_s=0.0, keep_alive_max_s=0.0),
    PolicyConfig(dispersion_window_s=0.0, burst_window_s=40.0),  # a burst window longer than the delay window
    PolicyConfig(scale_down_delay_s=5.0, trend_window_s=8.0, budget_window_s=4.0, budget_clean_windows=2,
                 gaps_min=2, onset_gap_s=6.0, slice_window_s=20.0, periodic_keep_s=3.0),
    # windows of 0 s, at wall-clock times where now - 0 - EPS rounds to now (policy.window_start)
    PolicyConfig(burst_window_s=0.0, scale_down_delay_s=0.0, trend_window_s=0.0),
)
STARTS = (100.0, 100.0, 100.0, 100.0, 1.7e9)


def _own(config: PolicyConfig):
    """The same config as the compiled module's own PolicyConfig (its decide() takes no other)."""
    return S._as_class(compiled.PolicyConfig, config)


def _own_spec(spec: ScalingSpec):
    """The same spec as the group's own ScalingSpec (the compiled decide() takes no other)."""
    return S._as_class(compiled_spec.ScalingSpec, spec)


def _spec(rng: np.random.Generator) -> ScalingSpec:
    low = int(rng.choice([0, 0, 0, 1, 2]))
    idle = float(rng.choice([0.0, 5.0, 30.0, 60.0]))
    most = rng.choice([None, None, idle, idle + 240.0])  # the function's own keep-alive bound
    return ScalingSpec(min_replicas=low, max_replicas=int(rng.integers(max(1, low), 12)),
                       slo_p95_ms=float(rng.choice([20.0, 100.0, 400.0])), target_duty=float(rng.uniform(0.5, 0.9)),
                       target_concurrency=float(rng.choice([1.0, 2.0, 4.0])),
                       idle_to_zero_s=idle, keep_alive_max_s=None if most is None else float(most))


def _looks(rng: np.random.Generator, steps: int, start: float = 100.0):
    """(now, snapshot) of one function, as a generator that is sent each look's decision:
    its replicas follow the decisions (new ones start, then turn ready; now and then one
    fails or one comes that was not asked for), its traffic wanders around its own level
    with silences (regular ones: a timer), the clock steps by 0 to 3 s, and now and then
    the same time comes twice or the clock steps back."""
    now, ready, starting = start, int(rng.integers(0, 4)), 0
    period = float(rng.choice([0.0, 8.0, 25.0]))  # a timer's period, or none
    table = TABLES[int(rng.integers(len(TABLES)))]
    level = float(rng.lognormal(3.0, 1.5))  # the function's usual requests per second
    for step in range(steps):
        u = rng.random()
        now += 0.0 if u < 0.03 else -0.5 if u < 0.04 else float(rng.choice([0.5, 1.0, 1.0, 1.0, 3.0]))
        if period and step % 12 == 11:
            now += period + float(rng.normal(0.0, 0.05))
        if starting and rng.random() < 0.4:
            ready, starting = ready + 1, starting - 1
        if ready and rng.random() < 0.02:
            ready -= 1
        if rng.random() < 0.02:  # one it did not ask for (left from an earlier revision): over max_replicas too
            ready += 1
        idle = rng.random() < 0.2 or (period and step % 12 > 6)
        rps = 0.0 if idle else level * float(rng.lognormal(0.0, 0.4))
        service = float(rng.uniform(0.001, 0.05)) if rps else None
        duty = min(1.0, rps * service / max(1, ready)) if rps else float(rng.choice([0.0, 0.01]))
        u = rng.random()  # now and then a scrape short of a replica, or with one that is no longer ready
        shown = max(0, ready - 1) if u < 0.05 else ready + 1 if u < 0.08 else ready
        decision = yield now, MetricsSnapshot(
            "f", now, ready=ready, starting=starting, inflight=0.0 if idle else float(rng.exponential(3.0)),
            activator_queue=int(rng.choice([0, 0, 0, 5, 40])) if ready == 0 else 0,
            duty=(duty,) * shown, rps=rps,
            p95_s=float(rng.uniform(0.001, 0.6)) if rps and rng.random() < 0.8 else None,
            cold_start_s=float(rng.choice([1.0, 8.0])) if rng.random() < 0.7 else None,
            slice_fraction=float(rng.choice([0.125, 0.25, 1.0])) if rng.random() < 0.9 else None,
            service_s=service, batch_latency_s=table if rng.random() < 0.9 else (),
            over_slo=float(rng.choice([0.0, 0.0, 0.0005, 0.02])) if rps else 0.0,
            # the gateway's: as rps, short of it, past it (held ones), or with no rps yet (a first scrape)
            answered_rps=rps * float(rng.choice([1.0, 1.0, 0.5, 1.3])) if rps else float(rng.choice([0.0, 0.0, 6.0])),
            window_s=float(rng.choice([0.0, 1.0, 1.0, 30.0])))
        change = decision.desired - ready - starting
        if change > 0:
            starting += change
        elif change < 0:  # a scale-down stops starting replicas first
            stop = min(starting, -change)
            starting, ready = starting - stop, ready + change + stop


@pytest.mark.parametrize("config, start", zip(CONFIGS, STARTS),
                         ids=["default", "no-averaging", "long-burst", "short-windows", "zero-windows-wall-clock"])
def test_every_look_is_the_same_compiled_or_not(config, start):
    """120 functions x 150 looks per config: the same decision (count, reason, detail, slice)
    and the same state (a Record equals another of the same fields), and the same
    quiet_until() and next_onset() after it. The reasons seen show the walks reach every
    branch that changes a count."""
    rng = np.random.default_rng(7)
    own = _own(config)
    reasons: dict[str, int] = {}
    for _ in range(120):
        spec = _spec(rng)
        fast_spec = _own_spec(spec)
        mine, theirs = interpreted.PolicyState(), compiled.PolicyState()
        looks = _looks(rng, 150, start)
        now, snapshot = next(looks)
        while True:
            decision, mine = interpreted.decide(snapshot, spec, mine, now, config)
            other, theirs = compiled.decide(compiled_snapshot.MetricsSnapshot(**snapshot._asdict()), fast_spec, theirs,
                                            now, own)
            assert other == decision
            assert theirs == mine and type(theirs.budget).__name__ == "Budget"
            current = decision.desired
            assert compiled.quiet_until(theirs, fast_spec, current, now, 2.0, own) == \
                interpreted.quiet_until(mine, spec, current, now, 2.0, config)
            assert compiled.next_onset(theirs, own) == interpreted.next_onset(mine, config)
            reasons[decision.reason] = reasons.get(decision.reason, 0) + 1
            try:
                now, snapshot = looks.send(decision)
            except StopIteration:
                break
    assert {"STABLE", "HOLD", "COLD_START", "FORECAST", "TO_ZERO", "BURST"} <= set(reasons) or \
        config.scale_down_delay_s == 0, reasons



def _tick(rng: np.random.Generator, fids: list[int], replicas: list[int], now: float) -> interpreted_looks.Tick:
    """A tick's measurements of `fids`: some idle (nothing answered: NaN p95 and service)."""
    ready = [int(rng.integers(0, r + 1)) for r in replicas]
    answered = [bool(rng.random() < 0.7) for _ in fids]
    nan = float("nan")
    return interpreted_looks.Tick(
        fids, ready, replicas, [float(rng.exponential(2.0)) if a else 0.0 for a in answered],
        [float(rng.uniform(0.0, 1.0)) if a else 0.0 for a in answered],
        [float(rng.lognormal(3.0, 1.0)) if a else 0.0 for a in answered],
        [float(rng.uniform(0.001, 0.3)) if a else nan for a in answered],
        [float(rng.uniform(0.001, 0.02)) if a else nan for a in answered],
        [float(rng.choice([0.0, 0.01])) if a else 0.0 for a in answered],
        [float(rng.lognormal(3.0, 1.0)) if a else 0.0 for a in answered], now, 1.0)


def test_a_ticks_looks_are_the_same_compiled_or_not():
    """looks.look_each compiled with policy.py (one mypyc group) against both interpreted:
    200 ticks of 40 functions, counts following the decisions; the same looks to act on
    (snapshot and decision), the same quiet times and the same states. And each look is
    decide() on snapshot_of(): the interpreted look_each against decide() one by one."""
    fast_policy, fast_looks = compiled, compiled_looks
    rng = np.random.default_rng(11)
    n = 40
    specs = [_spec(rng) for _ in range(n)]
    functions = interpreted_looks.Functions(
        [f"f{i}" for i in range(n)], specs, [2.0] * n, [0.25] * n, [0.5] * n, [TABLES[i % len(TABLES)] for i in range(n)],
        {3: [0.5, 0.7], 9: [0.9]})
    fast_functions = functions._replace(specs=[_own_spec(spec) for spec in specs])
    replicas = [int(rng.integers(0, 4)) for _ in range(n)]
    mine: dict = {}
    theirs: dict = {}
    one_by_one: dict = {}
    acted_seen = 0
    for step in range(200):
        fids = sorted(int(f) for f in rng.choice(n, size=25, replace=False))
        tick = _tick(rng, fids, [replicas[f] for f in fids], 100.0 + step)
        acted, quiet = interpreted_looks.look_each(tick, functions, mine)
        other, other_quiet = fast_looks.look_each(tick, fast_functions, theirs, fast_policy.PolicyConfig())
        assert [(a.fid, a.snapshot, a.decision) for a in other] == [(a.fid, a.snapshot, a.decision) for a in acted]
        assert other_quiet == quiet and theirs == mine
        for i, fid in enumerate(fids):
            snapshot = interpreted_looks.snapshot_of(tick, i, functions)
            decision, one_by_one[fid] = interpreted.decide(snapshot, specs[fid], one_by_one.get(
                fid, interpreted.PolicyState()), tick.now)
            replicas[fid] = max(0, decision.desired)
        assert one_by_one == mine
        acted_seen += len(acted)
    assert 0 < acted_seen < 200 * 25


def test_a_group_calls_its_own_compiled_modules(tmp_path, monkeypatch):
    """load_group builds modules that import each other under the group's names: the second
    calls the first as compiled in the group, not the interpreted module; the same sources in
    another group are another build. Another form of import of a module of the group is
    refused before a build."""
    package = tmp_path / "src" / "shoalgrouptest"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "rule.py").write_text("def scaled(x: float) -> float:\n    return x * 2\n")
    (package / "user.py").write_text("from shoalgrouptest.rule import scaled\n\n\n"
                                     "def twice(x: float) -> float:\n    return scaled(scaled(x))\n")
    (package / "other.py").write_text("import shoalgrouptest.rule\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setenv("SHOAL_COMPILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_loaded", {})
    importlib.invalidate_caches()
    rule, user = native.load_group(("shoalgrouptest.rule", "shoalgrouptest.user"))
    assert user.twice(1.5) == 6.0 and user.scaled is rule.scaled
    assert rule.__name__.startswith("shoal_rule_") and user.__name__ == "shoal_user_" + rule.__name__[len("shoal_rule_"):]
    # the same sources grouped otherwise are built apart: user alone calls the interpreted rule
    alone, = native.load_group(("shoalgrouptest.user",))
    assert alone.__name__ != user.__name__ and alone.scaled is not rule.scaled and alone.twice(1.5) == 6.0
    with pytest.raises(native.CompileError, match="other, line 1"):
        native.load_group(("shoalgrouptest.rule", "shoalgrouptest.other"))


def _record(trace, compiled_: bool, gpus: int) -> tuple[dict, S.ShoalPolicy]:
    profiles = S.assign_profiles(trace, 0)
    policy = S.ShoalPolicy(compiled=compiled_)
    sim = S.Simulation(trace, profiles, policy, S.SimConfig(gpus=gpus, tick_s=1.0), S.warm_start(trace, profiles))
    return {k: v for k, v in sim.run().items() if "wall" not in k}, policy


@pytest.mark.parametrize("kind, options, gpus", [
    ("azure", dict(functions=300, seconds=150.0), 40),
    ("gamma", dict(functions=4, seconds=120.0, rate=300.0, cv=4.0), 8),
])
def test_whole_runs_are_the_same_compiled_or_not(kind, options, gpus):
    """The simulator with the compiled policy gives the interpreted policy's record, every
    number of it, and leaves every function in the same state."""
    trace = make_trace(kind, seed=3, **options)
    fast, policy = _record(trace, True, gpus)
    reference, reference_policy = _record(trace, False, gpus)
    assert policy.engine == "compiled (mypyc)" and reference_policy.engine == "interpreted"
    assert fast == reference
    assert policy.states == reference_policy.states and policy.states


def test_without_a_compiler_the_interpreted_policy_runs_and_says_so(monkeypatch):
    def fail(modules):
        raise native.CompileError("mypyc is not installed (pip install mypy)")

    monkeypatch.setattr(native, "load_group", fail)
    with pytest.warns(RuntimeWarning, match="policy.py and looks.py run interpreted"):
        policy = S.ShoalPolicy()
    assert policy.module is interpreted and policy.looks is interpreted_looks
    assert policy.engine == "interpreted (not compiled: mypyc is not installed (pip install mypy))"


@pytest.mark.timeout(600)
def test_an_edited_source_is_built_again_never_served_stale(tmp_path, monkeypatch):
    """The cache key is the source's: after an edit, load() builds and loads the new source
    under a new name; the old build stays for a checkout that still has the old source."""
    package = tmp_path / "src" / "shoalcachetest"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    source = package / "rule.py"
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setenv("SHOAL_COMPILE_CACHE", str(tmp_path / "cache"))
    loaded = []
    for factor in (2, 3):
        source.write_text(textwrap.dedent(f"""
            def scaled(x: float) -> float:
                return x * {factor}
        """))
        importlib.invalidate_caches()
        monkeypatch.setattr(native, "_loaded", {})
        loaded.append(native.load("shoalcachetest.rule"))
    assert [m.scaled(1.5) for m in loaded] == [3.0, 4.5]
    assert loaded[0].__name__ != loaded[1].__name__ and all(m.__name__ in sys.modules for m in loaded)
    assert len(list((tmp_path / "cache").iterdir())) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        monkeypatch.setattr(native, "_loaded", {})
        assert native.load("shoalcachetest.rule").__name__ == loaded[1].__name__  # from the cache, not rebuilt


def test_a_cache_others_may_write_to_is_refused(tmp_path, monkeypatch):
    # what the cache holds is loaded as code: a folder others can write is not used
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    monkeypatch.setenv("SHOAL_COMPILE_CACHE", str(folder))
    with pytest.raises(native.CompileError, match="not this user's alone"):
        native._trusted_cache()
    folder.chmod(0o700)
    assert native._trusted_cache() == folder


def test_the_type_check_tree_holds_packages_as_their_init(tmp_path):
    # an installed shoal's root is site-packages, which mypy refuses: the build writes the
    # sources it hashed into a tree of its own, a package as its __init__
    sources = {"autoscaler.placement": b"from autoscaler.placement.types import Device\n",
               "autoscaler.placement.types": b"class Device: ...\n", "functions.spec": b"X = 1\n"}
    for module, source in sources.items():
        native._write_module(tmp_path, module, source, any(o.startswith(module + ".") for o in sources))
    assert (tmp_path / "autoscaler" / "placement" / "__init__.py").read_bytes() == sources["autoscaler.placement"]
    assert (tmp_path / "autoscaler" / "placement" / "types.py").read_bytes() == sources["autoscaler.placement.types"]
    assert (tmp_path / "autoscaler" / "__init__.py").read_bytes() == b""
    assert (tmp_path / "functions" / "spec.py").read_bytes() == b"X = 1\n"


@pytest.mark.parametrize("name", ["MetricsSnapshot", "PolicyState"])
def test_records_compare_field_by_field_compiled_or_not(name):
    """A compiled record keeps no signature; its fields come from mypyc's list of native
    attributes, the same names in the same order, so == weighs every field: a record one field
    apart is unequal, compiled against interpreted both ways, and _replace builds by name."""
    from autoscaler import policy as interpreted_policy, snapshot as interpreted_snapshot
    from autoscaler.record import fields_of

    fast = compiled_snapshot.MetricsSnapshot if name == "MetricsSnapshot" else compiled.PolicyState
    slow = interpreted_snapshot.MetricsSnapshot if name == "MetricsSnapshot" else interpreted_policy.PolicyState
    names = fields_of(slow)
    assert len(names) > 10 and fields_of(fast) == names
    args = ("f", 1.0) if name == "MetricsSnapshot" else ()
    a, b = fast(*args), slow(*args)
    assert a == b and b == a
    for field in names[len(args):]:
        value = getattr(b, field)
        other = {"extra": {"x": 1.0}, "budget": compiled.Budget(3.0), "needs": (compiled.NeedAt(1.0, 2.0),),
                 "batch_latency_s": ((1.0, 0.01),), "forecast": compiled.NeedAt(1.0, 2.0), "gap_quantiles": (1.0, 2.0),
                 "peak": compiled.NeedAt(1.0, 2.0)}.get(field, 7 if isinstance(value, int) else (7.5,) if isinstance(value, tuple)
                                        else "g" if isinstance(value, str) else 7.5)
        assert a._replace(**{field: other}) != b and b != a._replace(**{field: other}), field
    with pytest.raises(AttributeError):
        setattr(a, names[-1], 1)
