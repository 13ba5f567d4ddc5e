"""Loader detection, the emulated profile's latency curve, slice bindings."""

from __future__ import annotations

from fractions import Fraction

import pytest

from functions.spec import SliceRequest
from serving.executor import bind_slice, parse_cpus, slice_env
from serving.models import LoadError, detect_loader
from serving.models.onnx import providers_for
from serving.models.base import LoadOptions
from serving.models.profile import interpolate_ms

POINTS = [(1, 4.0), (8, 6.0), (32, 14.0)]


@pytest.mark.parametrize(
    "rows,expected",
    [
        (1, 4.0),  # a profile point
        (4, 4.0 + (6.0 - 4.0) * (4 - 1) / (8 - 1)),  # between 1 and 8: 4 + 2*3/7
        (8, 6.0),
        (20, 6.0 + (14.0 - 6.0) * (20 - 8) / (32 - 8)),  # 6 + 8*12/24 = 10
        (64, 14.0 + (14.0 - 6.0) * (64 - 32) / (32 - 8)),  # last slope continues: 14 + 8*32/24
    ],
    ids=["point", "between", "point-8", "between-8-32", "beyond-last"],
)
def test_profile_interpolation(rows, expected):
    assert interpolate_ms(POINTS, rows) == pytest.approx(expected)


def test_single_point_profile_is_constant():
    assert interpolate_ms([(1, 5.0)], 16) == 5.0


@pytest.mark.parametrize(
    "name,loader",
    [("m.onnx", "onnx"), ("m.pt", "torchscript"), ("m.joblib", "sklearn"), ("m.pkl", "sklearn"), ("p.yaml", "profile")],
)
def test_detect_by_suffix(tmp_path, name, loader):
    assert detect_loader(str(tmp_path / name)) == loader


@pytest.mark.parametrize(
    "source,loader",
    [
        ("def handler(context, event):\n    return 'ok'\n", "handler"),
        ("async def handler(context, event):\n    return 'ok'\n", "handler"),
        ("import kserve\nclass M(kserve.Model):\n    pass\n", "kserve"),
        ("from kserve import Model\nclass M(Model):\n    pass\n", "kserve"),
    ],
    ids=["handler", "async-handler", "kserve-attr", "kserve-from"],
)
def test_detect_python_without_running_it(tmp_path, source, loader):
    path = tmp_path / "f.py"
    path.write_text("raise SystemExit('must not run')\n" + source)
    assert detect_loader(str(path)) == loader


@pytest.mark.parametrize(
    "name,source,fragment",
    [("m.bin", None, "cannot tell how to load"), ("x.py", "def other(): pass\n", "defines neither"), ("y.py", "def (:\n", "not valid Python")],
)
def test_detect_errors(tmp_path, name, source, fragment):
    path = tmp_path / name
    if source is not None:
        path.write_text(source)
    with pytest.raises(LoadError) as err:
        detect_loader(str(path))
    assert fragment in str(err.value)


def test_parse_cpus():
    assert parse_cpus("0-2,5") == (0, 1, 2, 5)
    assert parse_cpus(None) is None
    with pytest.raises(ValueError, match="'0-x' is invalid"):
        parse_cpus("0-x")


@pytest.mark.parametrize(
    "fraction,cpus,cores,threads",
    [
        (Fraction(1, 4), None, 2, 1),  # ceil(0.25 * 2) = 1
        (Fraction(1, 2), None, 16, 8),  # ceil(0.5 * 16) = 8
        (Fraction(1, 3), None, 16, 6),  # ceil(5.33) = 6
        (Fraction(1, 4), (0, 1, 2), 16, 3),  # explicit CPUs decide
    ],
)
def test_bind_slice_threads(fraction, cpus, cores, threads):
    assert bind_slice(SliceRequest(fraction), "cpu", cpus, cores).threads == threads


def test_gpu_slice_environment_and_providers():
    binding = bind_slice(SliceRequest(Fraction(1, 4), memory_mib=2048), "gpu:1", None, 16)
    env = slice_env(binding)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "1=2048M"
    options = LoadOptions(device="gpu:1", gpu_mem_limit_mib=2048)
    assert providers_for(options, ["CUDAExecutionProvider", "CPUExecutionProvider"]) == [
        ("CUDAExecutionProvider", {"device_id": 1, "gpu_mem_limit": 2048 * 1024 * 1024}), "CPUExecutionProvider",
    ]
    # an onnxruntime build without CUDA falls back to the CPU rather than failing
    assert providers_for(options, ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]


def test_emulated_binding_is_labelled():
    binding = bind_slice(SliceRequest(Fraction(1, 8)), "emulated:0", None, 2)
    assert binding.emulated and binding.labels()["emulated"] == "true"
    with pytest.raises(ValueError, match="expected cpu, gpu:N or emulated:N"):
        bind_slice(SliceRequest(), "tpu:0", None, 2)
