"""What this machine has: GPUs found with NVML (nvidia-ml-py), and its memory. No NVIDIA driver
(as on these development machines) is not an error: no GPUs, and the inventory falls back to the CPU.
"""

from __future__ import annotations

import logging
import os

from autoscaler.placement import Device

log = logging.getLogger("shoal.inventory")


def discover_gpus() -> list[Device]:
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.debug("NVML unavailable: %s", exc)
        return []
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20
            devices.append(Device(f"gpu:{i}", "gpu", int(memory), name=name))
        return devices
    finally:
        pynvml.nvmlShutdown()


def memory_mib() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20)
    except (ValueError, OSError, AttributeError):
        return 4096


def usable_cpus() -> tuple[int, ...]:
    """The cores this process may run on (its affinity mask)."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))
