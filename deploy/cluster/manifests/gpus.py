"""A function's slice in each GPU sharing mode of a Kubernetes cluster (pure: no I/O, no clock).
`gpu_request(sharing, slice_)` turns a `SliceRequest` ("1/4", or "1/4:8192" with a memory
budget) into what a pod asks for in the cluster's mode (hami, timeslice, mps, mig, vgpu):
extended resources, pod annotations, a node selector, a scheduler name. A slice that a mode
cannot express exactly is a `ManifestError` naming the slices it can express: Shoal never
rounds a slice into a different one behind the user's back. What each mode asks for and
isolates, with the sources, is in docs/kubernetes.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from functions.spec import SliceRequest

MODES = ("hami", "timeslice", "mps", "mig", "vgpu")
HAMI_POLICIES = ("binpack", "spread")


class ManifestError(ValueError):
    """What was asked cannot be rendered as asked."""


@dataclass(frozen=True)
class MigProfile:
    name: str  # "1g.10gb"
    sevenths: int  # compute: g / 7 of the SMs
    memory_gb: int


@dataclass(frozen=True)
class GpuModel:
    name: str  # as GPU Feature Discovery writes it, e.g. "A100-SXM4-80GB" is shortened to "A100-80GB"
    memory_mib: int
    mig: tuple[MigProfile, ...] = ()
    vgpu_framebuffers_gb: tuple[int, ...] = ()  # sizes of its C-series (compute) vGPU profiles

    @property
    def family(self) -> str:
        return self.name.split("-", 1)[0]


def _mig(*profiles: tuple[str, int, int]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(n, g, m) for n, g, m in profiles)


GPUS: dict[str, GpuModel] = {g.name: g for g in (
    GpuModel("A100-40GB", 40 * 1024,
             _mig(("1g.5gb", 1, 5), ("1g.10gb", 1, 10), ("2g.10gb", 2, 10), ("3g.20gb", 3, 20), ("4g.20gb", 4, 20),
                  ("7g.40gb", 7, 40)),
             (4, 5, 8, 10, 20, 40)),
    GpuModel("A100-80GB", 80 * 1024,
             _mig(("1g.10gb", 1, 10), ("1g.20gb", 1, 20), ("2g.20gb", 2, 20), ("3g.40gb", 3, 40), ("4g.40gb", 4, 40),
                  ("7g.80gb", 7, 80)),
             (4, 5, 8, 10, 16, 20, 40, 80)),
    GpuModel("H100-80GB", 80 * 1024,
             _mig(("1g.10gb", 1, 10), ("1g.20gb", 1, 20), ("2g.20gb", 2, 20), ("3g.40gb", 3, 40), ("4g.40gb", 4, 40),
                  ("7g.80gb", 7, 80)),
             (4, 5, 8, 10, 16, 20, 40, 80)),
    GpuModel("V100-16GB", 16 * 1024, (), (1, 2, 4, 8, 16)),
    GpuModel("L4-24GB", 24 * 1024, (), (1, 2, 3, 4, 6, 8, 12, 24)),
)}


@dataclass(frozen=True)
class GpuRequest:
    """What a replica's pod asks for, in one mode."""

    mode: str
    resources: dict[str, str]  # extended resources, as limits (and requests: Kubernetes wants them equal)
    annotations: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    scheduler_name: str | None = None
    description: str = ""


@dataclass(frozen=True)
class Sharing:
    """How this cluster shares its GPUs: one mode for the whole cluster."""

    mode: str = "hami"
    gpu: str = "A100-80GB"
    ways: int = 4  # timeslice / mps: how many replicas share one GPU
    hami_policy: str = "binpack"
    vgpu_label: str = "nvidia.com/gpu.product"  # GFD's label; VMware setups often label nodes vgpu.type
    vgpu_series: str = "C"  # compute profiles (NVIDIA AI Enterprise); Q for workstation profiles

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ManifestError(f"unknown GPU sharing mode {self.mode!r}; allowed: {', '.join(MODES)}")
        if self.gpu not in GPUS:
            raise ManifestError(f"unknown GPU model {self.gpu!r}; allowed: {', '.join(GPUS)}")
        if not isinstance(self.ways, int) or not 2 <= self.ways <= 48:
            raise ManifestError(f"ways={self.ways!r}: a GPU is shared by 2 to 48 replicas")
        if self.hami_policy not in HAMI_POLICIES:
            raise ManifestError(f"hami_policy {self.hami_policy!r}; allowed: {', '.join(HAMI_POLICIES)}")
        if self.vgpu_series not in ("C", "Q", "B", "A"):
            raise ManifestError(f"vgpu_series {self.vgpu_series!r}; allowed: C (compute), Q, B, A")
        if self.mode == "mig" and not GPUS[self.gpu].mig:
            raise ManifestError(f"{self.gpu} has no MIG; MIG GPUs: {', '.join(n for n, g in GPUS.items() if g.mig)}")

    @property
    def model(self) -> GpuModel:
        return GPUS[self.gpu]


def gpu_request(sharing: Sharing, slice_: SliceRequest) -> GpuRequest:
    """The pod's GPU ask for `slice_` under `sharing`; ManifestError when the mode cannot express it."""
    return _BUILDERS[sharing.mode](sharing, sharing.model, slice_.fraction, slice_.memory_mib)


def expressible(sharing: Sharing) -> list[str]:
    """The slices this cluster's mode can express (for error messages and `shoal k8s render --help`)."""
    g = sharing.model
    if sharing.mode in ("timeslice", "mps"):
        return [f"1/{sharing.ways}"]
    if sharing.mode == "mig":
        return sorted({_frac(Fraction(p.sevenths, 7)) for p in g.mig}, key=Fraction)
    if sharing.mode == "vgpu":
        return [_frac(Fraction(fb * 1024, g.memory_mib)) for fb in g.vgpu_framebuffers_gb]
    return ["any p/100 (whole percent of SMs) whose memory share is a whole MiB"]


def _hami(s: Sharing, g: GpuModel, f: Fraction, memory_mib: int | None) -> GpuRequest:
    pct = f * 100
    if pct.denominator != 1:
        raise ManifestError(f"slice {_frac(f)} is {float(pct):.2f}% of the SMs; HAMi's nvidia.com/gpucores takes "
                            f"whole percents: use a slice of p/100 (such as {_frac(Fraction(int(pct), 100))})")
    if memory_mib is None:
        mem = f * g.memory_mib
        if mem.denominator != 1:
            raise ManifestError(f"slice {_frac(f)} of {g.memory_mib} MiB is {float(mem):.1f} MiB; give the memory "
                                "in whole MiB (slice 'F:MIB')")
        memory_mib = int(mem)
    if memory_mib > g.memory_mib:
        raise ManifestError(f"memory {memory_mib} MiB is more than a {g.name} has ({g.memory_mib} MiB)")
    return GpuRequest("hami", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory_mib),
                               "nvidia.com/gpucores": str(int(pct))},
                      annotations={"hami.io/gpu-scheduler-policy": s.hami_policy,
                                   "hami.io/node-scheduler-policy": s.hami_policy,
                                   "nvidia.com/use-gputype": g.family},
                      scheduler_name="hami-scheduler",
                      description=f"HAMi: {int(pct)}% of the SMs and {memory_mib} MiB of one {g.name}")


def _shared(s: Sharing, g: GpuModel, f: Fraction, memory_mib: int | None) -> GpuRequest:
    name = "time-slicing" if s.mode == "timeslice" else "MPS"
    if f != Fraction(1, s.ways):
        raise ManifestError(f"slice {_frac(f)} cannot be expressed with {name} sharing each GPU {s.ways} ways: "
                            f"every replica gets 1/{s.ways} (choose slice 1/{s.ways}, or another mode)")
    if memory_mib is not None:
        share = g.memory_mib // s.ways
        if s.mode == "timeslice":
            raise ManifestError(f"time-slicing cannot limit memory: a memory budget of {memory_mib} MiB would not be "
                                "enforced (drop it, or use hami, mps or mig)")
        if memory_mib != share:
            raise ManifestError(f"MPS gives each of {s.ways} clients an equal {share} MiB; {memory_mib} MiB cannot "
                                "be expressed")
    return GpuRequest(s.mode, {"nvidia.com/gpu": "1"},
                      node_selector={"nvidia.com/gpu.replicas": str(s.ways)},
                      description=f"{name}: one of {s.ways} shares of a {g.name}")


def _mig_request(s: Sharing, g: GpuModel, f: Fraction, memory_mib: int | None) -> GpuRequest:
    matching = [p for p in g.mig if Fraction(p.sevenths, 7) == f]
    if not matching:
        raise ManifestError(f"slice {_frac(f)} is not a MIG profile of {g.name}: MIG slices are sevenths of the SMs "
                            f"({', '.join(expressible(s))})")
    fitting = [p for p in matching if memory_mib is None or p.memory_gb * 1024 >= memory_mib]
    if not fitting:
        raise ManifestError(f"no {_frac(f)} MIG profile of {g.name} has {memory_mib} MiB "
                            f"({', '.join(f'{p.name}' for p in matching)})")
    p = min(fitting, key=lambda p: p.memory_gb)
    return GpuRequest("mig", {f"nvidia.com/mig-{p.name}": "1"},
                      node_selector={"nvidia.com/mig.strategy": "mixed"},
                      description=f"MIG {p.name}: {p.sevenths}/7 of the SMs and {p.memory_gb} GB of a {g.name}")


def _vgpu(s: Sharing, g: GpuModel, f: Fraction, memory_mib: int | None) -> GpuRequest:
    framebuffer = f * g.memory_mib / 1024
    if memory_mib is not None and Fraction(memory_mib, 1024) != framebuffer:
        raise ManifestError(f"a vGPU's memory is its profile's framebuffer ({float(framebuffer):g} GB for slice "
                            f"{_frac(f)}); {memory_mib} MiB cannot be expressed")
    if framebuffer.denominator != 1 or int(framebuffer) not in g.vgpu_framebuffers_gb:
        sizes = ", ".join(f"{fb} GB = {x}" for fb, x in zip(g.vgpu_framebuffers_gb, expressible(s)))
        raise ManifestError(f"slice {_frac(f)} of a {g.name} is {float(framebuffer):g} GB: no vGPU profile has that "
                            f"framebuffer ({sizes})")
    profile = f"{g.family}-{int(framebuffer)}{s.vgpu_series}"
    if s.vgpu_label == "nvidia.com/gpu.product":
        value = f"GRID-{profile}"  # how GPU Feature Discovery names a vGPU
    else:
        value = f"{profile.lower()}-{int(framebuffer)}GB"  # e.g. vgpu.type=v100-8q-8GB, set by the admin
    return GpuRequest("vgpu", {"nvidia.com/gpu": "1"}, node_selector={s.vgpu_label: value},
                      description=f"vGPU {profile}: a {int(framebuffer)} GB framebuffer of a {g.name}")


def _frac(f: Fraction) -> str:
    return "1" if f == 1 else f"{f.numerator}/{f.denominator}"


_BUILDERS = {"hami": _hami, "timeslice": _shared, "mps": _shared, "mig": _mig_request, "vgpu": _vgpu}
