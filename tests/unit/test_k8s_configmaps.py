"""ConfigMapRegistry.put_function against a writer that races it (tests/fakes/kube.py keeps the
resourceVersion check of the real API server: a stale replace is a 409)."""

from __future__ import annotations

import json

import pytest

from deploy.cluster.configmaps import ConfigMapFunctions, ConfigMapRegistry
from functions.registry import NotFound
from functions.spec import spec_from_dict
from tests.fakes.kube import FakeKube, api_error

NS = "shoal"


def spec(name: str, max_replicas: int):
    return spec_from_dict({"name": name, "artifact": "sha256/ab/model.onnx", "scaling": {"max_replicas": max_replicas}})


class Racing(FakeKube):
    """After the registry has read the ConfigMaps, `other` writes first (once per queued spec)."""

    def __init__(self) -> None:
        super().__init__()
        self.other: list = []
        self.other_registry: ConfigMapRegistry | None = None

    def list_namespaced_config_map(self, namespace, label_selector=None):
        listing = super().list_namespaced_config_map(namespace, label_selector)
        if self.other:
            self.other_registry.put_function(self.other.pop(0), 2.0)
        return listing


def stored(kube: FakeKube, name: str) -> tuple[int, dict]:
    cm = kube.config_maps[(NS, f"function-{name}")]
    return int(cm["data"]["revision"]), json.loads(cm["data"]["spec.json"])


def test_a_replace_that_meets_a_409_reads_again_and_counts_the_revision_from_the_winner():
    kube = Racing()
    ours, theirs = ConfigMapRegistry(kube, NS, lambda: 1.0), ConfigMapRegistry(FakeKube(), NS, lambda: 1.0)
    theirs.core = _Plain(kube)
    kube.other_registry = theirs
    ours.put_function(spec("f", 1), 1.0)  # revision 1
    kube.other.append(spec("f", 2))  # revision 2, written between our read and our write
    record, changed = ours.put_function(spec("f", 3), 3.0)
    assert changed and record.revision == 3
    assert stored(kube, "f")[0] == 3
    assert stored(kube, "f")[1]["scaling"]["max_replicas"] == 3
    replaces = [c for c in kube.calls if c.startswith("replace_namespaced_config_map")]
    assert len(replaces) == 3  # theirs, our 409, our retry


def test_a_create_that_meets_already_exists_becomes_a_replace():
    kube = Racing()
    ours, theirs = ConfigMapRegistry(kube, NS, lambda: 1.0), ConfigMapRegistry(_Plain(kube), NS, lambda: 1.0)
    kube.other_registry = theirs
    kube.other.append(spec("g", 2))  # they create it after our read saw nothing
    record, changed = ours.put_function(spec("g", 5), 3.0)
    assert changed and record.revision == 2
    assert stored(kube, "g")[0] == 2 and stored(kube, "g")[1]["scaling"]["max_replicas"] == 5


def test_the_same_spec_raced_in_is_no_new_revision():
    kube = Racing()
    ours, theirs = ConfigMapRegistry(kube, NS, lambda: 1.0), ConfigMapRegistry(_Plain(kube), NS, lambda: 1.0)
    kube.other_registry = theirs
    ours.put_function(spec("h", 1), 1.0)
    kube.other.append(spec("h", 4))
    record, changed = ours.put_function(spec("h", 4), 3.0)
    assert not changed and record.revision == 2


def test_conflicts_without_end_give_up_with_the_409_and_other_errors_are_not_retried():
    kube = FakeKube()
    reg = ConfigMapRegistry(kube, NS, lambda: 1.0)
    reg.put_function(spec("f", 1), 1.0)
    kube.fail("replace_namespaced_config_map", *[api_error(409, "conflict") for _ in range(5)])
    with pytest.raises(Exception) as info:
        reg.put_function(spec("f", 2), 2.0)
    assert info.value.status == 409
    assert sum(c.startswith("replace_namespaced_config_map") for c in kube.calls) == 5
    kube.failures.clear()
    kube.fail("replace_namespaced_config_map", api_error(422, "invalid"))
    with pytest.raises(Exception) as info:
        reg.put_function(spec("f", 2), 2.0)
    assert info.value.status == 422
    assert sum(c.startswith("replace_namespaced_config_map") for c in kube.calls) == 6


class _Plain:
    """The same store as `kube`, without its race (the other writer's own view)."""

    def __init__(self, kube: FakeKube):
        self.kube = kube

    def __getattr__(self, name):
        if name == "list_namespaced_config_map":
            return lambda ns, label_selector=None: FakeKube.list_namespaced_config_map(self.kube, ns, label_selector)
        return getattr(self.kube, name)


def test_a_removed_function_deployed_again_counts_on_from_its_last_revision():
    kube = FakeKube()
    reg = ConfigMapRegistry(kube, NS, lambda: 1.0)
    reg.put_function(spec("f", 1), 1.0)
    reg.put_function(spec("f", 2), 2.0)  # revision 2
    reg.delete_function("f")
    assert reg.list_functions() == []
    with pytest.raises(NotFound):
        reg.get_function("f")
    with pytest.raises(NotFound):
        reg.delete_function("f")  # removed once is gone
    record, changed = reg.put_function(spec("f", 1), 5.0)  # the first spec again: still a new revision
    assert changed and record.revision == 3 and record.created_at == 5.0
    assert stored(kube, "f")[0] == 3 and stored(kube, "f")[1]["scaling"]["max_replicas"] == 1
    assert [r.revision for r in reg.list_functions()] == [3]


def test_what_rm_leaves_is_in_no_listing_of_functions():
    kube = FakeKube()
    reg = ConfigMapRegistry(kube, NS, lambda: 1.0)
    reg.put_function(spec("f", 1), 1.0)
    reg.put_function(spec("g", 1), 1.0)
    reg.delete_function("f")
    assert list(ConfigMapFunctions(kube, NS).functions()) == ["g"]  # the controller's and gateways' reading
    left = kube.config_maps[(NS, "function-f")]
    assert left["metadata"]["labels"]["shoal.dev/kind"] == "function-removed" and "spec.json" not in left["data"]


def test_a_removal_that_meets_a_409_reads_again():
    """Another writer deploys revision 2 between the removal's read and its write: the write is a
    409, the removal reads again and marks revision 2 as the last, so a deploy after it gets 3."""
    kube = Racing()
    ours, theirs = ConfigMapRegistry(kube, NS, lambda: 1.0), ConfigMapRegistry(_Plain(kube), NS, lambda: 1.0)
    kube.other_registry = theirs
    ours.put_function(spec("f", 1), 1.0)
    kube.other.append(spec("f", 2))  # written after the removal's first read
    ours.delete_function("f")
    assert ours.list_functions() == []
    assert kube.config_maps[(NS, "function-f")]["data"] == {"revision": "2"}
    assert sum(c.startswith("replace_namespaced_config_map") for c in kube.calls) == 3  # theirs, our 409, ours
    assert ours.put_function(spec("f", 3), 2.0)[0].revision == 3


def test_a_function_whose_spec_does_not_read_can_be_removed_and_deployed_over():
    """A function ConfigMap edited by hand into bad JSON is in no listing (the controller keeps
    what runs for it); `shoal rm` still removes it (a marker of its revision), and a deploy
    over it, or over its marker, takes the next revision instead of failing on AlreadyExists."""
    kube = FakeKube()
    reg = ConfigMapRegistry(kube, NS, lambda: 1.0)
    reg.put_function(spec("f", 1), 1.0)
    reg.put_function(spec("f", 2), 1.0)  # revision 2
    kube.config_maps[(NS, "function-f")]["data"]["spec.json"] = "{not json"
    functions = ConfigMapFunctions(kube, NS)
    assert reg.list_functions() == [] and functions.functions() == {} and functions.broken == {"f"}
    reg.delete_function("f")
    assert kube.config_maps[(NS, "function-f")]["data"] == {"revision": "2"}
    with pytest.raises(NotFound):
        reg.delete_function("f")
    # broken again, then deployed over without a removal
    assert reg.put_function(spec("f", 1), 2.0)[0].revision == 3
    kube.config_maps[(NS, "function-f")]["data"]["spec.json"] = "{not json"
    record, changed = reg.put_function(spec("f", 5), 3.0)
    assert changed and record.revision == 4 and [r.revision for r in reg.list_functions()] == [4]
    assert not any(c.startswith("create_namespaced_config_map") for c in kube.calls[-3:])
