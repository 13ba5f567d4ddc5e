"""What a function is: frozen specs with every default in one place (batching, slices, scaling),
validated, with messages that name the value that was wrong and what would be right, e.g.
"max_replicas (2) must be >= min_replicas (3)". It does no I/O and imports nothing from
serving, autoscaler or deploy. The simulator compiles it with the policy (mypyc,
autoscaler.native.POLICY_GROUP): it must stay compilable, or the scale run runs interpreted.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field, fields
from fractions import Fraction
from typing import Any

NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class SpecError(ValueError):
    """A spec value is invalid; the message names the value and the rule."""


def validate_name(name: str, what: str = "function name") -> str:
    """Names become URL path parts, file names and Kubernetes object names
    (RFC 1123 label: lowercase alphanumerics and '-', at most 63 characters)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SpecError(
            f"{what} {name!r} is invalid: use 1-63 lowercase letters, digits or '-', "
            "starting and ending with a letter or digit"
        )
    return name


@dataclass(frozen=True, slots=True)
class BatchingSpec:
    """Dynamic batching, as Triton's dynamic_batcher, and opt-in as there: only the user knows
    that a model's first dimension is a batch dimension (a softmax over a free one is not)."""

    max_batch_size: int = 1  # rows per batch; 1 disables batching
    max_queue_delay_ms: float = 0.0  # how long the oldest request may wait for a fuller batch
    preferred_batch_sizes: tuple[int, ...] = ()  # sizes that run as soon as they are reached
    max_queue_requests: int = 1024  # requests waiting in the replica before it answers 503

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise SpecError(f"max_batch_size ({self.max_batch_size}) must be >= 1")
        if not 0 <= self.max_queue_delay_ms <= 10_000:
            raise SpecError(
                f"max_queue_delay_ms ({self.max_queue_delay_ms}) must be within 0..10000"
            )
        for size in self.preferred_batch_sizes:
            if not 1 <= size <= self.max_batch_size:
                raise SpecError(
                    f"preferred batch size {size} must be within 1..max_batch_size "
                    f"({self.max_batch_size})"
                )
        if self.max_queue_requests < 1:
            raise SpecError(f"max_queue_requests ({self.max_queue_requests}) must be >= 1")

    @property
    def max_queue_delay_s(self) -> float:
        return self.max_queue_delay_ms / 1000.0


@dataclass(frozen=True, slots=True)
class ServingLimits:
    """Limits every listener applies (replica and gateway): body size, how long a
    request may take, how long a graceful shutdown may drain."""

    max_body_bytes: int = 64 * 1024 * 1024
    request_timeout_s: float = 60.0
    graceful_shutdown_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise SpecError(f"max_body_bytes ({self.max_body_bytes}) must be >= 1024")
        if self.request_timeout_s <= 0:
            raise SpecError(f"request_timeout_s ({self.request_timeout_s}) must be > 0")
        if self.graceful_shutdown_s < 0:
            raise SpecError(f"graceful_shutdown_s ({self.graceful_shutdown_s}) must be >= 0")


LIMITS = ServingLimits()
MAX_TIMEOUT_S = 600.0  # a function's own request timeout, at most (Knative's max-revision-timeout-seconds)

SLICE_RE = re.compile(r"^(?P<num>\d+)/(?P<den>\d+)$")


@dataclass(frozen=True, slots=True)
class SliceRequest:
    """The share of one device a replica asks for: "1/4" of its compute and memory,
    or an explicit memory budget (memory_mib) when the model needs less or more."""

    fraction: Fraction = Fraction(1, 4)
    memory_mib: int | None = None

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise SpecError(f"slice fraction ({self.fraction}) must be within (0, 1]")
        if self.memory_mib is not None and self.memory_mib <= 0:
            raise SpecError(f"slice memory_mib ({self.memory_mib}) must be > 0")

    @property
    def name(self) -> str:
        return f"{self.fraction.numerator}/{self.fraction.denominator}"

    @property
    def compute_pct(self) -> float:
        return float(self.fraction) * 100.0

    @classmethod
    def parse(cls, text: str) -> "SliceRequest":
        """Parse "1/4", "1/4:2048" (memory MiB) or "1" (a whole device)."""
        share, _, mem = str(text).partition(":")
        if share.strip() == "1":
            fraction = Fraction(1)
        else:
            m = SLICE_RE.match(share.strip())
            if not m or int(m["den"]) == 0:
                raise SpecError(f"slice {text!r} is invalid: expected a fraction like '1/4' or '1/4:2048'")
            fraction = Fraction(int(m["num"]), int(m["den"]))
        memory = None
        if mem:
            if not mem.strip().isdigit():
                raise SpecError(f"slice memory {mem!r} must be an integer number of MiB")
            memory = int(mem)
        return cls(fraction=fraction, memory_mib=memory)


@dataclass(frozen=True, slots=True)
class ScalingSpec:
    min_replicas: int = 0
    max_replicas: int = 8
    slo_p95_ms: float = 100.0
    target_duty: float = 0.7
    target_concurrency: float = 4.0
    idle_to_zero_s: float = 60.0
    # the most an idle function is kept past its last request where a cold start would miss the
    # SLO and the keep-alive prices those misses (autoscaler.policy.keep_alive_s); None: the
    # platform's bound (PolicyConfig.keep_alive_max_s); idle_to_zero_s itself: always go at
    # idle_to_zero_s, cold starts accepted (Ray Serve's downscale_delay_s, exact)
    keep_alive_max_s: float | None = None
    # replicas each new revision is raised to at once and held at until that many are ready, the
    # autoscaler deciding from then on (Knative's initial-scale, whose default is 1; Ray Serve's
    # initial_replicas, within [min, max] as here); 0: it starts at min_replicas, at zero by
    # default, and its first request starts one
    initial_replicas: int = 0

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise SpecError(f"min_replicas ({self.min_replicas}) must be >= 0")
        if self.max_replicas < max(1, self.min_replicas):
            raise SpecError(
                f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas}) and >= 1"
            )
        if self.initial_replicas != 0 and not self.min_replicas <= self.initial_replicas <= self.max_replicas:
            raise SpecError(f"initial_replicas ({self.initial_replicas}) must be 0 (none) or within [min_replicas "
                            f"({self.min_replicas}), max_replicas ({self.max_replicas})]")
        if self.slo_p95_ms <= 0:
            raise SpecError(f"slo_p95_ms ({self.slo_p95_ms}) must be > 0")
        if not 0 < self.target_duty <= 1:
            raise SpecError(f"target_duty ({self.target_duty}) must be within (0, 1]")
        if self.target_concurrency <= 0:
            raise SpecError(f"target_concurrency ({self.target_concurrency}) must be > 0")
        if self.idle_to_zero_s < 0:
            raise SpecError(f"idle_to_zero_s ({self.idle_to_zero_s}) must be >= 0")
        if self.keep_alive_max_s is not None:
            if isinstance(self.keep_alive_max_s, bool) or not isinstance(self.keep_alive_max_s, (int, float)):
                raise SpecError(f"keep_alive_max_s must be a number of seconds or null, got {self.keep_alive_max_s!r}")
            if math.isinf(self.keep_alive_max_s):
                raise SpecError(f"keep_alive_max_s ({self.keep_alive_max_s}) must be finite "
                                "(to keep a replica always, set min_replicas)")
            if not self.keep_alive_max_s >= self.idle_to_zero_s:
                raise SpecError(f"keep_alive_max_s ({self.keep_alive_max_s}) must be >= idle_to_zero_s "
                                f"({self.idle_to_zero_s}), the least an idle function is kept")


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    """A deployable function: a model artifact, how it loads, its slice, scaling and batching."""

    name: str
    artifact: str
    loader: str | None = None
    trust: bool = False
    slice: SliceRequest = field(default_factory=SliceRequest)
    scaling: ScalingSpec = field(default_factory=ScalingSpec)
    batching: BatchingSpec = field(default_factory=BatchingSpec)
    version: str = "1"
    # how long one request may take in the model before it is answered 504 (KServe's
    # component `timeout`, Nuclio's `eventTimeout`); a replica busy past it is replaced
    timeout_s: float = LIMITS.request_timeout_s

    def __post_init__(self) -> None:
        validate_name(self.name)
        if not self.artifact:
            raise SpecError("artifact must not be empty")
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise SpecError(f"timeout_s ({self.timeout_s}) must be within (0, {MAX_TIMEOUT_S:g}]")
        if not re.match(r"^[A-Za-z0-9._-]{1,64}$", self.version):
            raise SpecError(f"version {self.version!r} must be 1-64 of [A-Za-z0-9._-]")


def spec_defaults() -> dict[str, dict[str, Any]]:
    """Every default, by section: what the example config must parse to."""
    return {
        cls.__name__: {f.name: getattr(cls(), f.name) for f in fields(cls)}
        for cls in (BatchingSpec, SliceRequest, ScalingSpec, ServingLimits)
    }


def same_runtime(a: FunctionSpec, b: FunctionSpec) -> bool:
    """Whether running replicas of `a` can serve `b`: scaling changes apply to them in
    place (Ray Serve's lightweight update); any other change needs new replicas."""
    return dataclasses.replace(a, scaling=b.scaling) == b


def spec_to_dict(spec: FunctionSpec) -> dict[str, Any]:
    """A FunctionSpec as plain JSON-able data (the registry's and the API's form)."""
    slice_text = spec.slice.name + (f":{spec.slice.memory_mib}" if spec.slice.memory_mib else "")
    return {
        "name": spec.name,
        "artifact": spec.artifact,
        "loader": spec.loader,
        "trust": spec.trust,
        "version": spec.version,
        "slice": slice_text,
        "scaling": {f.name: getattr(spec.scaling, f.name) for f in fields(ScalingSpec)},
        "batching": {
            f.name: list(v) if isinstance(v := getattr(spec.batching, f.name), tuple) else v
            for f in fields(BatchingSpec)
        },
        "timeout_s": spec.timeout_s,
    }


def spec_from_dict(doc: dict[str, Any]) -> FunctionSpec:
    """Parse and validate; unknown keys are errors that name the key."""
    if not isinstance(doc, dict):
        raise SpecError(f"a function spec must be an object, got {type(doc).__name__}")
    known = {"name", "artifact", "loader", "trust", "version", "slice", "scaling", "batching", "timeout_s"}
    unknown = set(doc) - known
    if unknown:
        raise SpecError(f"unknown function spec field(s) {sorted(unknown)}; expected {sorted(known)}")
    scaling = _section(ScalingSpec, doc.get("scaling"), "scaling")
    batching_doc = dict(doc.get("batching") or {})
    if "preferred_batch_sizes" in batching_doc:
        batching_doc["preferred_batch_sizes"] = tuple(batching_doc["preferred_batch_sizes"])
    batching = _section(BatchingSpec, batching_doc, "batching")
    return FunctionSpec(
        name=doc.get("name", ""),
        artifact=doc.get("artifact", ""),
        loader=doc.get("loader"),
        trust=bool(doc.get("trust", False)),
        version=str(doc.get("version", "1")),
        slice=SliceRequest.parse(doc.get("slice", "1/4")),
        scaling=scaling,
        batching=batching,
        timeout_s=_number(doc.get("timeout_s", LIMITS.request_timeout_s), "timeout_s"),
    )


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{where} must be a number, got {value!r}")
    return float(value)


def _section(cls, doc: Any, where: str):
    if doc is None:
        return cls()
    if not isinstance(doc, dict):
        raise SpecError(f"'{where}' must be an object")
    names = {f.name for f in fields(cls)}
    unknown = set(doc) - names
    if unknown:
        raise SpecError(f"unknown '{where}' field(s) {sorted(unknown)}; expected {sorted(names)}")
    try:
        return cls(**doc)
    except TypeError as exc:
        raise SpecError(f"'{where}': {exc}") from None
