"""The artifact store and the registry, on a temporary directory."""

from __future__ import annotations

import os

import pytest

from functions.artifacts import ArtifactError, ArtifactStore, ArtifactTooLarge, parse_ref
from functions.registry import NotFound, Registry
from functions.spec import FunctionSpec, ScalingSpec


def test_content_addressed_and_stored_once(tmp_path):
    store = ArtifactStore(tmp_path / "a")
    first = store.put_bytes(b"model bytes", "m.onnx")
    again = store.put_bytes(b"model bytes", "m.onnx")
    assert first == again and first.ref.startswith("sha256:") and first.ref.endswith("/m.onnx")
    path = store.path(first.ref)
    assert path.read_bytes() == b"model bytes" and path.is_relative_to(tmp_path / "a")
    assert os.listdir(tmp_path / "a" / "tmp") == []  # no temporary file left behind


@pytest.mark.parametrize("name", ["../evil.onnx", "a/b.onnx", "..onnx", ".hidden.onnx", "model.exe", ""])
def test_bad_file_names_are_refused(tmp_path, name):
    with pytest.raises(ArtifactError):
        ArtifactStore(tmp_path).put_bytes(b"x", name)
    assert not (tmp_path.parent / "evil.onnx").exists()


def test_size_limit_refuses_and_keeps_nothing(tmp_path):
    store = ArtifactStore(tmp_path, max_bytes=10)
    with pytest.raises(ArtifactTooLarge, match="exceeds the limit of 10 bytes"):
        store.put([b"12345", b"678901"], "m.onnx")  # 5 + 6 = 11 > 10
    assert os.listdir(tmp_path / "tmp") == [] and not (tmp_path / "sha256").exists()


def test_refs_are_validated():
    with pytest.raises(ArtifactError):
        parse_ref("sha256:abc/../../etc/passwd")
    with pytest.raises(ArtifactError):
        parse_ref("md5:" + "a" * 64 + "/m.onnx")


def test_registry_survives_reopening_and_counts_revisions(tmp_path):
    ref = "sha256:" + "a" * 64 + "/m.onnx"
    reg = Registry(tmp_path / "r.db")
    assert reg.put_function(FunctionSpec("f", ref), now=1.0).revision == 1
    assert reg.put_function(FunctionSpec("f", ref), now=2.0).revision == 1  # unchanged spec: same revision
    changed = FunctionSpec("f", ref, scaling=ScalingSpec(max_replicas=2))
    assert reg.put_function(changed, now=3.0).revision == 2
    reg.add_event(4.0, "scale", "0 -> 1", "f", {"to": 1})
    reg.close()

    reopened = Registry(tmp_path / "r.db")
    record = reopened.get_function("f")
    assert record.spec == changed and record.revision == 2 and record.created_at == 1.0
    assert reopened.revisions("f") == [1, 2]
    assert [(e.kind, e.data) for e in reopened.events("f")] == [("scale", {"to": 1})]
    reopened.delete_function("f")
    with pytest.raises(NotFound):
        reopened.get_function("f")
