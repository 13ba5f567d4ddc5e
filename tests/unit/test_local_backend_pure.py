"""How the local backend enforces a slice: the replica's command line and environment,
for CPU, GPU and emulated placements; and NVML discovery with a stand-in library."""

from __future__ import annotations

import random
import shutil
import socket
import sys
import tempfile
import types
from fractions import Fraction
from pathlib import Path

from autoscaler.placement import Device, Placement
from deploy.local.backend import PORT_FLOOR, _socket_dir, ephemeral_ports, free_port, replica_argv, replica_env
from deploy.local.inventory import discover_gpus
from functions.spec import BatchingSpec, FunctionSpec

SPEC = FunctionSpec("f", "sha256:" + "a" * 64 + "/m.onnx", batching=BatchingSpec(max_batch_size=8, max_queue_delay_ms=2))


def test_gpu_slice_is_enforced_by_visible_devices_mps_and_memory():
    gpu = Device("gpu:3", "gpu", 81920)
    placement = Placement("f-1", gpu, Fraction(1, 4), 20480, ())
    env = replica_env(placement)
    assert env["CUDA_VISIBLE_DEVICES"] == "3"  # the replica sees only its GPU...
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"  # ...as device 0
    argv = replica_argv(SPEC, placement, Path("/a/m.onnx"), "127.0.0.1", 9000, "/tmp/s.sock")
    assert argv[argv.index("--device") + 1] == "gpu:0"
    assert argv[argv.index("--slice") + 1] == "1/4:20480"  # the framework's memory limit
    assert argv[argv.index("--uds") + 1] == "/tmp/s.sock"
    assert argv[argv.index("--max-batch-size") + 1] == "8"


def test_cpu_slice_is_enforced_by_affinity_and_hides_gpus():
    cpu = Device("cpu:0", "cpu", 16384, cpus=(0, 1, 2, 3))
    placement = Placement("f-1", cpu, Fraction(1, 2), 0, (2, 3))
    assert replica_env(placement)["CUDA_VISIBLE_DEVICES"] == ""
    argv = replica_argv(SPEC, placement, Path("/a/m.onnx"), "127.0.0.1", 9000)
    assert argv[argv.index("--cpus") + 1] == "2,3" and argv[argv.index("--device") + 1] == "cpu"


def test_emulated_placement_is_passed_through():
    emu = Device("emulated:1", "emulated", 81920)
    argv = replica_argv(SPEC, Placement("f-1", emu, Fraction(1, 8), 10240, ()), Path("/a/p.yaml"), "127.0.0.1", 9000)
    assert argv[argv.index("--device") + 1] == "emulated:1"
    assert argv[argv.index("--profile-slice") + 1] == "1/4"  # resized from the deployed 1/4: a profile runs 2x
    deployed = replica_argv(SPEC, Placement("f-1", emu, Fraction(1, 4), 10240, ()), Path("/a/p.yaml"), "127.0.0.1", 9000)
    assert "--profile-slice" not in deployed  # on its deployed slice a profile's latencies hold as written


def test_nvml_discovery(monkeypatch):
    class NVMLError(Exception):
        pass

    fake = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=80 * 2**30),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus = discover_gpus()
    assert [(g.id, g.kind, g.memory_mib, g.name) for g in gpus] == [
        ("gpu:0", "gpu", 81920, "NVIDIA H100 80GB HBM3"), ("gpu:1", "gpu", 81920, "NVIDIA H100 80GB HBM3")]

    def no_driver():
        raise NVMLError("Driver Not Loaded")

    monkeypatch.setattr(fake, "nvmlInit", no_driver)
    assert discover_gpus() == []  # no driver: the CPU is the inventory


def test_a_long_state_dir_gets_one_socket_dir_cleared_at_the_next_start(tmp_path):
    # a state dir too long for sun_path: the sockets go to a temp dir named after it, so a
    # control plane killed with sockets in it leaves nothing the next start does not clear
    deep = tmp_path / ("x" * 80)
    first = _socket_dir(deep)
    (first / "steady-1.sock").write_text("left by a killed control plane")
    again = _socket_dir(deep)
    try:
        assert again == first and str(again).startswith(tempfile.gettempdir())
        assert list(again.iterdir()) == []
    finally:
        shutil.rmtree(again, ignore_errors=True)
    short = Path(tempfile.mkdtemp(prefix="s"))
    try:
        assert _socket_dir(short) == short.resolve() / "sockets"
    finally:
        shutil.rmtree(short)


def test_a_replicas_port_is_drawn_below_the_ephemeral_range():
    """Ports bind(0) gives lie in the kernel's ephemeral range, where an outgoing connection can
    take one before the replica binds it; free_port draws below it, each free when drawn."""
    ports = [free_port("127.0.0.1", (32768, 60999), random.Random(seed)) for seed in range(20)]
    assert all(PORT_FLOOR <= p < 32768 for p in ports) and len(set(ports)) > 15, ports
    for port in ports:  # free when drawn: a replica can bind it
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_taken_is_drawn_again():
    first, second = (free_port("127.0.0.1", (32768, 60999), random.Random(seed)) for seed in (1, 2))
    assert first != second

    class Rigged(random.Random):  # draws `first`, then `second`
        draws = iter([first, second])

        def randrange(self, *args):
            return next(self.draws)
    with socket.socket() as held:  # another process holds the first draw
        held.bind(("127.0.0.1", first))
        assert free_port("127.0.0.1", (32768, 60999), Rigged()) == second


def test_a_port_of_a_replica_still_starting_is_not_drawn():
    # a replica still loading has not bound its port: free to a bind, taken all the same
    first, second = (free_port("127.0.0.1", (32768, 60999), random.Random(seed)) for seed in (3, 4))

    class Rigged(random.Random):  # draws `first`, then `second`
        draws = iter([first, second])

        def randrange(self, *args):
            return next(self.draws)
    assert free_port("127.0.0.1", (32768, 60999), Rigged(), taken={first}) == second


class NoDraw(random.Random):
    def randrange(self, *args):
        raise AssertionError("drew a port where the kernel should pick")


def test_without_a_known_range_the_kernel_picks(tmp_path):
    assert ephemeral_ports(tmp_path / "absent") is None
    (tmp_path / "range").write_text("32768\t60999\n")
    assert ephemeral_ports(tmp_path / "range") == (32768, 60999)
    # a range that leaves under 1,024 ports above the floor: bind(0)'s port, no draw
    assert 0 < free_port("127.0.0.1", (PORT_FLOOR + 10, 60999), NoDraw()) < 65536

