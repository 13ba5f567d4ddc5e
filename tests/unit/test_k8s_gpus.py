"""deploy/cluster/manifests/gpus.py: a slice in each GPU sharing mode, exact or refused, with the arithmetic beside each."""

from __future__ import annotations

import pytest

from deploy.cluster.manifests.gpus import GPUS, ManifestError, Sharing, expressible, gpu_request
from functions.spec import SliceRequest


def ask(mode: str, slice_: str, **kw):
    return gpu_request(Sharing(mode=mode, **kw), SliceRequest.parse(slice_))


@pytest.mark.parametrize("gpu, slice_, cores, mem", [
    ("A100-80GB", "1/4", "25", "20480"),  # 80 GiB = 81,920 MiB; / 4 = 20,480
    ("A100-80GB", "1/2", "50", "40960"),
    ("A100-40GB", "1/4", "25", "10240"),  # 40,960 / 4
    ("A100-80GB", "1/10", "10", "8192"),  # 81,920 / 10
    ("A100-80GB", "1", "100", "81920"),
    ("V100-16GB", "3/100", "3", "3072"),  # 3 % of 16,384 MiB is 491.52 MiB: refused below, unless memory given
])
def test_hami_takes_percent_of_sms_and_mib(gpu, slice_, cores, mem):
    if slice_ == "3/100":
        with pytest.raises(ManifestError, match=r"491\.5 MiB; give the memory in whole MiB"):
            ask("hami", slice_, gpu=gpu)
        r = ask("hami", "3/100:3072", gpu=gpu)
    else:
        r = ask("hami", slice_, gpu=gpu)
    assert r.resources == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": mem, "nvidia.com/gpucores": cores}
    assert r.scheduler_name == "hami-scheduler"


def test_hami_policy_and_card_type_annotations():
    r = ask("hami", "1/4", hami_policy="spread", gpu="H100-80GB")
    assert r.annotations == {"hami.io/gpu-scheduler-policy": "spread", "hami.io/node-scheduler-policy": "spread",
                             "nvidia.com/use-gputype": "H100"}


@pytest.mark.parametrize("slice_, message", [
    ("1/3", r"33\.33% of the SMs; HAMi's nvidia.com/gpucores takes whole percents.*33/100"),
    ("1/8", r"12\.50% of the SMs"),
    ("1/4:90000", r"memory 90000 MiB is more than a A100-80GB has \(81920 MiB\)"),
])
def test_hami_refuses_what_it_cannot_express(slice_, message):
    with pytest.raises(ManifestError, match=message):
        ask("hami", slice_)


@pytest.mark.parametrize("mode", ["timeslice", "mps"])
def test_shared_modes_express_exactly_one_over_ways(mode):
    r = ask(mode, "1/4", ways=4)
    assert r.resources == {"nvidia.com/gpu": "1"} and r.node_selector == {"nvidia.com/gpu.replicas": "4"}
    assert ask(mode, "1/8", ways=8).node_selector == {"nvidia.com/gpu.replicas": "8"}
    with pytest.raises(ManifestError, match=r"slice 1/2 cannot be expressed .* 4 ways: every replica gets 1/4"):
        ask(mode, "1/2", ways=4)


def test_timeslicing_refuses_a_memory_budget_it_cannot_enforce():
    with pytest.raises(ManifestError, match="time-slicing cannot limit memory"):
        ask("timeslice", "1/4:4096")


def test_mps_memory_is_an_equal_share():
    # 81,920 MiB / 4 clients = 20,480 MiB each: that budget is what MPS gives, anything else is not
    assert ask("mps", "1/4:20480").resources == {"nvidia.com/gpu": "1"}
    with pytest.raises(ManifestError, match=r"equal 20480 MiB; 8192 MiB cannot be expressed"):
        ask("mps", "1/4:8192")


@pytest.mark.parametrize("gpu, slice_, profile", [
    ("A100-80GB", "1/7", "1g.10gb"),  # the smaller of 1g.10gb and 1g.20gb
    ("A100-80GB", "1/7:16384", "1g.20gb"),  # 16 GiB does not fit 1g.10gb
    ("A100-80GB", "2/7", "2g.20gb"),
    ("A100-80GB", "3/7", "3g.40gb"),
    ("A100-80GB", "4/7", "4g.40gb"),
    ("A100-80GB", "1", "7g.80gb"),
    ("A100-40GB", "1/7", "1g.5gb"),
    ("A100-40GB", "2/7", "2g.10gb"),
    ("H100-80GB", "3/7", "3g.40gb"),
])
def test_mig_profiles_are_sevenths(gpu, slice_, profile):
    r = ask("mig", slice_, gpu=gpu)
    assert r.resources == {f"nvidia.com/mig-{profile}": "1"}
    assert r.node_selector == {"nvidia.com/mig.strategy": "mixed"}


@pytest.mark.parametrize("slice_, message", [
    ("1/4", r"slice 1/4 is not a MIG profile of A100-80GB: MIG slices are sevenths .*\(1/7, 2/7, 3/7, 4/7, 1\)"),
    ("5/7", "not a MIG profile"),
    ("1/7:30000", r"no 1/7 MIG profile of A100-80GB has 30000 MiB \(1g.10gb, 1g.20gb\)"),
])
def test_mig_refuses_what_it_cannot_express(slice_, message):
    with pytest.raises(ManifestError, match=message):
        ask("mig", slice_)


def test_mig_needs_a_mig_gpu():
    with pytest.raises(ManifestError, match="V100-16GB has no MIG"):
        Sharing(mode="mig", gpu="V100-16GB")


@pytest.mark.parametrize("gpu, slice_, label, value", [
    ("A100-80GB", "1/4", "nvidia.com/gpu.product", "GRID-A100-20C"),  # 80 GB / 4 = 20 GB: A100-20C
    ("V100-16GB", "1/2", "nvidia.com/gpu.product", "GRID-V100-8C"),
    ("V100-16GB", "1/2", "vgpu.type", "v100-8c-8GB"),
])
def test_vgpu_profiles_select_nodes(gpu, slice_, label, value):
    r = ask("vgpu", slice_, gpu=gpu, vgpu_label=label)
    assert r.resources == {"nvidia.com/gpu": "1"} and r.node_selector == {label: value}


def test_vgpu_workstation_series():
    assert ask("vgpu", "1/2", gpu="V100-16GB", vgpu_label="vgpu.type", vgpu_series="Q").node_selector == \
        {"vgpu.type": "v100-8q-8GB"}  # the issue's example label


def test_vgpu_refuses_a_framebuffer_no_profile_has():
    # V100-16GB: 16 GB / 3 = 5.33 GB; profiles are 1, 2, 4, 8 and 16 GB
    with pytest.raises(ManifestError, match=r"5\.33333 GB: no vGPU profile has that framebuffer"):
        ask("vgpu", "1/3", gpu="V100-16GB")
    with pytest.raises(ManifestError, match="profile's framebuffer"):
        ask("vgpu", "1/2:4096", gpu="V100-16GB")


def test_expressible_lists():
    assert expressible(Sharing(mode="timeslice", ways=6)) == ["1/6"]
    assert expressible(Sharing(mode="mig", gpu="A100-40GB")) == ["1/7", "2/7", "3/7", "4/7", "1"]
    assert expressible(Sharing(mode="vgpu", gpu="V100-16GB")) == ["1/16", "1/8", "1/4", "1/2", "1"]


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "kata"}, "unknown GPU sharing mode 'kata'"),
    ({"gpu": "B200"}, "unknown GPU model 'B200'"),
    ({"ways": 1}, "ways=1"),
    ({"hami_policy": "random"}, "hami_policy 'random'"),
    ({"vgpu_series": "X"}, "vgpu_series 'X'"),
])
def test_bad_sharing_is_refused(kwargs, message):
    with pytest.raises(ManifestError, match=message):
        Sharing(**kwargs)


def test_every_gpu_has_consistent_tables():
    for g in GPUS.values():
        assert all(1 <= p.sevenths <= 7 and p.memory_gb * 1024 <= g.memory_mib for p in g.mig)
        assert all(fb * 1024 <= g.memory_mib for fb in g.vgpu_framebuffers_gb)
