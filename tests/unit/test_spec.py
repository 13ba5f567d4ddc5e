"""Specs: every default in one place, validated with messages that name both values."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from functions.spec import (
    BatchingSpec,
    FunctionSpec,
    ScalingSpec,
    SliceRequest,
    SpecError,
    spec_defaults,
    spec_from_dict,
    spec_to_dict,
    validate_name,
)


@pytest.mark.parametrize(
    "text,fraction,memory",
    [("1/4", Fraction(1, 4), None), ("1/2:2048", Fraction(1, 2), 2048), ("1", Fraction(1), None), ("2/8", Fraction(1, 4), None)],
    ids=["quarter", "half-with-memory", "whole", "reduced"],
)
def test_slice_parse(text, fraction, memory):
    s = SliceRequest.parse(text)
    assert (s.fraction, s.memory_mib) == (fraction, memory)


@pytest.mark.parametrize(
    "text,fragment",
    [("a/b", "expected a fraction"), ("1/0", "expected a fraction"), ("3/2", "within (0, 1]"), ("1/4:lots", "integer number of MiB")],
)
def test_slice_parse_errors(text, fragment):
    with pytest.raises(SpecError) as err:
        SliceRequest.parse(text)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"min_replicas": 3, "max_replicas": 2}, "max_replicas (2) must be >= min_replicas (3) and >= 1"),
        ({"target_duty": 1.5}, "target_duty (1.5) must be within (0, 1]"),
        ({"slo_p95_ms": 0}, "slo_p95_ms (0) must be > 0"),
        ({"initial_replicas": -1}, "initial_replicas (-1) must be 0 (none) or within [min_replicas (0), max_replicas (8)]"),
        ({"initial_replicas": 3, "max_replicas": 2},
         "initial_replicas (3) must be 0 (none) or within [min_replicas (0), max_replicas (2)]"),
        ({"initial_replicas": 1, "min_replicas": 2},  # Ray Serve's rule: min <= initial <= max
         "initial_replicas (1) must be 0 (none) or within [min_replicas (2), max_replicas (8)]"),
        ({"keep_alive_max_s": 30.0},  # under idle_to_zero_s (60 s), the least an idle function is kept
         "keep_alive_max_s (30.0) must be >= idle_to_zero_s (60.0), the least an idle function is kept"),
        ({"keep_alive_max_s": "600"}, "keep_alive_max_s must be a number of seconds or null, got '600'"),
        ({"keep_alive_max_s": True}, "keep_alive_max_s must be a number of seconds or null, got True"),
        ({"keep_alive_max_s": math.inf},
         "keep_alive_max_s (inf) must be finite (to keep a replica always, set min_replicas)"),
        ({"keep_alive_max_s": math.nan},
         "keep_alive_max_s (nan) must be >= idle_to_zero_s (60.0), the least an idle function is kept"),
    ],
)
def test_scaling_validation_names_values(kwargs, message):
    with pytest.raises(SpecError) as err:
        ScalingSpec(**kwargs)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"max_batch_size": 0}, "max_batch_size (0) must be >= 1"),
        ({"max_batch_size": 8, "preferred_batch_sizes": (16,)}, "preferred batch size 16 must be within 1..max_batch_size (8)"),
        ({"max_queue_delay_ms": -1}, "max_queue_delay_ms (-1) must be within 0..10000"),
    ],
)
def test_batching_validation(kwargs, message):
    with pytest.raises(SpecError) as err:
        BatchingSpec(**kwargs)
    assert str(err.value) == message


@pytest.mark.parametrize("name", ["digits", "a", "resnet-50", "x1"])
def test_valid_names(name):
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", "Digits", "../etc", "a_b", "-a", "a-", "x" * 64, "a/b"])
def test_invalid_names(name):
    with pytest.raises(SpecError):
        validate_name(name)


def test_function_spec_defaults():
    spec = FunctionSpec(name="digits", artifact="sha256:abc")
    assert spec.slice.name == "1/4" and spec.scaling.min_replicas == 0 and spec.batching.max_batch_size == 1
    defaults = spec_defaults()
    assert defaults["BatchingSpec"] == {
        "max_batch_size": 1, "max_queue_delay_ms": 0.0, "preferred_batch_sizes": (), "max_queue_requests": 1024,
    }
    assert defaults["ScalingSpec"]["idle_to_zero_s"] == 60.0
    assert defaults["ScalingSpec"]["initial_replicas"] == 0  # from zero, as before: the first request starts one
    assert defaults["ScalingSpec"]["keep_alive_max_s"] is None  # the platform's bound
    assert defaults["ServingLimits"] == {"max_body_bytes": 64 * 2**20, "request_timeout_s": 60.0, "graceful_shutdown_s": 30.0}


def test_a_functions_keep_alive_bound_round_trips_and_names_bad_values():
    doc = {"name": "f", "artifact": "sha256:abc", "scaling": {"idle_to_zero_s": 5, "keep_alive_max_s": 5}}
    spec = spec_from_dict(doc)
    assert spec.scaling.keep_alive_max_s == 5 and spec_from_dict(spec_to_dict(spec)) == spec
    assert spec_from_dict({"name": "f", "artifact": "sha256:abc"}).scaling.keep_alive_max_s is None
    with pytest.raises(SpecError, match=r"keep_alive_max_s \(1\) must be >= idle_to_zero_s \(5\)"):
        spec_from_dict({**doc, "scaling": {"idle_to_zero_s": 5, "keep_alive_max_s": 1}})
