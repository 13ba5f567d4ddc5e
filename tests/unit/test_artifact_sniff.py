"""functions/sniff.py: good and bad bytes of every artifact type, the message each bad one gets,
bounded reads on huge files, and the upload path that keeps nothing of a refused artifact."""

from __future__ import annotations

import os
import pickle
import time
import tracemalloc

import pytest

from functions.artifacts import ArtifactError, ArtifactStore
from functions.sniff import GRAPH_FIELDS, MODEL_FIELDS, SniffLimits, sniff_artifact
from tests.conftest import EXAMPLES
from tests.fakes.artifacts import (
    GRAPH,
    TORCHSCRIPT_MEMBERS,
    as_zip64,
    deflate_bomb,
    notebook,
    onnx_model,
    patch_eocd,
    pb_int,
    pb_len,
    stored_zip,
    varint,
)

GIB = 1024**3
TS = TORCHSCRIPT_MEMBERS
TS_ZIP = stored_zip(TS)
HANDLER = b"def handler(context, event):\n    return event.body\n"

GOOD = [
    ("onnx", "m.onnx", onnx_model(), "onnx"),
    ("onnx-unknown-field", "m.onnx", onnx_model() + pb_len(99, b"from a newer onnx"), "onnx"),
    ("onnx-empty-graph", "m.onnx", onnx_model(graph=b""), "onnx"),
    ("torchscript", "m.pt", TS_ZIP, "torchscript"),
    ("torchscript-zip64", "m.pth", as_zip64(TS_ZIP), "torchscript"),
    ("torchscript-suffix", "m.torchscript", TS_ZIP, "torchscript"),
    ("handler", "h.py", HANDLER, "python"),
    ("handler-utf8", "h.py", "# é, ü\n".encode() + HANDLER, "python"),
    # read as the import system reads source: a UTF-8 BOM, a coding line, CRLF line ends
    ("handler-bom", "h.py", b"\xef\xbb\xbf" + HANDLER, "python"),
    ("handler-latin1-declared", "h.py", "# -*- coding: latin-1 -*-\n# café\n".encode("latin-1") + HANDLER, "python"),
    ("handler-crlf", "h.py", HANDLER.replace(b"\n", b"\r\n"), "python"),
    ("notebook", "n.ipynb", notebook(["def handler(context, event):\n    return 1"]), "notebook"),
    ("profile", "p.yaml", (EXAMPLES / "emulated_resnet.yaml").read_bytes(), "profile"),
    ("profile-yml", "p.yml", b"kind: profile\nlatency_ms: {1: 2.0}\n", "profile"),
]

BAD = [
    # ONNX: a file that is not a ModelProto, with the byte where it stops being one
    ("onnx-text", "m.onnx", b"this is not onnx", "byte 0: tag 116 (field 14, wire type 4) is not a field"),
    ("onnx-pickle", "m.onnx", pickle.dumps(1, protocol=4), "is not a field of a message"),
    ("onnx-json", "m.onnx", b'{"ir_version": 8}', "wire type 3"),  # '{' = 0x7b: field 15, wire type 3
    ("onnx-zip", "m.onnx", TS_ZIP, "is not a serialized onnx.ModelProto"),
    ("onnx-empty", "m.onnx", b"", "m.onnx is empty"),
    ("onnx-truncated", "m.onnx", onnx_model()[:40], "runs to byte"),
    ("onnx-no-graph", "m.onnx", pb_int(1, 8) + pb_len(8, pb_int(2, 13)), "no graph (field 7)"),
    ("onnx-no-ir-version", "m.onnx", pb_len(7, GRAPH), "no ir_version (field 1)"),
    ("onnx-ir-version-garbage", "m.onnx", onnx_model(ir_version=10**12), "ir_version 1000000000000 is not"),
    ("onnx-graph-as-varint", "m.onnx", pb_int(1, 8) + pb_int(7, 3), "graph (field 7) has wire type 0, expected 2"),
    # a TensorProto (dims: 1, data_type: 2 varints) is protobuf, but not a model
    ("onnx-other-message", "m.onnx", pb_int(1, 3) + pb_int(2, 1), "producer_name (field 2) has wire type 0"),
    ("onnx-endless-varint", "m.onnx", b"\x08" + b"\xff" * 12, "does not end within 10 bytes"),
    ("onnx-bad-graph", "m.onnx", pb_int(1, 8) + pb_len(7, b"\x0f\x00"), "byte 4: tag 15 (field 1, wire type 7)"),
    # TorchScript: not a zip, a zip bomb, hostile member names, a checkpoint
    ("pt-not-zip", "m.pt", b"\x80\x02legacy torch.save pickle", "not a zip archive"),
    ("pt-empty", "m.pt", b"", "m.pt is empty"),
    ("pt-truncated", "m.pt", TS_ZIP[: len(TS_ZIP) // 2], "no end of central directory record"),
    ("pt-checkpoint", "m.pt", stored_zip([(b"archive/data.pkl", b"."), (b"archive/version", b"3")]),
     "no constants.pkl"),
    ("pt-declares-1-tib", "m.pt", stored_zip(TS, {b"archive/data.pkl": 2**40}), "a zip bomb?"),
    # 3 GiB declared in a file of about 500 bytes: 100 x 500 B < 64 MiB, so the floor (64 MiB) is the limit
    ("pt-declares-3-gib", "m.pt", stored_zip(TS, {b"archive/data.pkl": 3 * GIB}), "the limit is 67108864 bytes"),
    ("pt-zip64-members", "m.pt", as_zip64(TS_ZIP, entries=10**9), "declares 1000000000 members"),
    ("pt-absolute", "m.pt", stored_zip(TS + [(b"/etc/passwd", b"x")]), "member named '/etc/passwd'"),
    ("pt-dotdot", "m.pt", stored_zip(TS + [(b"archive/../../x", b"x")]), "'..' part"),
    ("pt-backslash", "m.pt", stored_zip(TS + [(b"..\\x", b"x")]), "member named '..\\\\x'"),
    ("pt-drive", "m.pt", stored_zip(TS + [(b"C:/x", b"x")]), "drive letter"),
    ("pt-nul", "m.pt", stored_zip(TS + [(b"archive/a\x00b", b"x")]), "member named 'archive/a\\x00b'"),
    ("pt-split", "m.pt", patch_eocd(TS_ZIP, disk=1), "multi-part"),
    ("pt-cd-outside", "m.pt", patch_eocd(TS_ZIP, cd_offset=10**6), "runs past its end record"),
    ("pt-cd-damaged", "m.pt", patch_eocd(TS_ZIP, cd_offset=0), "central directory entry 0 is damaged"),
    # notebooks, handlers, profiles
    ("ipynb-not-json", "n.ipynb", b"print('hello')", "not JSON"),
    ("ipynb-list", "n.ipynb", b"[1, 2]", "without 'cells'"),
    ("ipynb-no-nbformat", "n.ipynb", b'{"cells": []}', "without 'cells' (a list) and 'nbformat'"),
    ("ipynb-utf16", "n.ipynb", '{"cells": []}'.encode("utf-16"), "byte 0xff at offset 0 is not UTF-8"),
    ("ipynb-deep", "n.ipynb", b"[" * 100_000, "nested too deeply"),
    # latin-1 in a string without a coding line (Python itself lets it pass in a comment)
    ("py-latin1", "h.py", 'x = "café"\n'.encode("latin-1") + HANDLER, "byte 0xe9 at offset 8 is not UTF-8"),
    ("py-nul", "h.py", HANDLER + b"\x00", "NUL byte"),
    ("py-binary", "h.py", TS_ZIP, "not UTF-8"),
    ("py-syntax", "h.py", HANDLER + b"def broken(:\n", "syntax error on line 3"),
    ("py-deep", "h.py", b"x = " + b"-" * 200_000 + b"1\n", "nested too deeply"),
    ("yaml-kind", "p.yaml", b"kind: model\n", "found kind 'model'"),
    ("yaml-list", "p.yaml", b"- kind: profile\n", "found a list"),
    ("yaml-invalid", "p.yaml", b"kind: [profile\n", "not valid YAML"),
    ("yaml-binary", "p.yaml", pickle.dumps(1, protocol=4), "not UTF-8"),
]


@pytest.mark.parametrize("filename, data, kind", [c[1:] for c in GOOD], ids=[c[0] for c in GOOD])
def test_good_artifacts_pass(tmp_path, filename, data, kind):
    path = tmp_path / filename
    path.write_bytes(data)
    assert sniff_artifact(path) == kind


@pytest.mark.parametrize("filename, data, fragment", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_artifacts_are_refused_with_the_reason(tmp_path, filename, data, fragment):
    path = tmp_path / filename
    path.write_bytes(data)
    with pytest.raises(ArtifactError) as err:
        sniff_artifact(path)
    assert fragment in str(err.value), str(err.value)
    assert str(err.value).startswith(filename)  # it names the file


def test_the_name_it_is_stored_under_decides_the_kind(tmp_path):
    staged = tmp_path / "tmpa1b2c3"  # the store's temporary file has no suffix
    staged.write_bytes(b"this is not onnx")
    with pytest.raises(ArtifactError, match=r"^model\.onnx is not a serialized onnx\.ModelProto"):
        sniff_artifact(staged, "model.onnx")
    with pytest.raises(ArtifactError, match=r"unknown type '\.exe'"):
        sniff_artifact(staged, "model.exe")


def test_a_pickle_is_never_opened(tmp_path):
    missing = tmp_path / "model.pkl"  # opening it would raise FileNotFoundError
    assert sniff_artifact(missing) == "pickle"
    assert sniff_artifact(missing, "model.joblib") == "pickle"


def test_a_real_deflate_bomb_is_refused_by_its_ratio(tmp_path):
    path = tmp_path / "bomb.pt"
    path.write_bytes(deflate_bomb(80))  # 80 MiB of zeros in about 80 KB
    size = path.stat().st_size
    assert size < 200_000
    # 80 MiB + 4 bytes declared > max(100 x ~80 KB = ~8 MB, 64 MiB floor) = 64 MiB
    with pytest.raises(ArtifactError, match=r"declare 83886084 bytes uncompressed .* \(a zip bomb\?\)"):
        sniff_artifact(path)
    # the same archive within the limits passes: it is the ratio that refuses it
    assert sniff_artifact(path, limits=SniffLimits(zip_ratio_floor_bytes=100 * 1024**2)) == "torchscript"


def test_member_count_limit(tmp_path):
    path = tmp_path / "m.pt"
    path.write_bytes(TS_ZIP)  # 4 members
    with pytest.raises(ArtifactError, match="declares 4 members, more than the limit of 3"):
        sniff_artifact(path, limits=SniffLimits(zip_members=3))


def _sparse(path, head: bytes, size: int, tail: bytes = b""):
    """A file of `size` bytes that takes no disk: `head`, a hole of zeros, `tail` at its very end."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size - len(tail))
        f.seek(size - len(tail))
        f.write(tail)
    return path


def _sniff_measured(path, filename=None):
    tracemalloc.start()
    started = time.monotonic()
    try:
        try:
            result = sniff_artifact(path, filename)
        except ArtifactError as exc:
            result = exc
        return result, time.monotonic() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_1_gib_onnx_model_is_walked_without_reading_it(tmp_path):
    # ModelProto{ir_version: 8, graph: 7{node: 1{...}}}, the node's payload a hole of zeros to the end of 1 GiB:
    # 2 bytes of ir_version + 1 + 5 (graph's tag and length) + 1 + 5 (node's) = 14 bytes of header
    size = GIB
    node_len = size - 14
    head = pb_int(1, 8) + b"\x3a" + varint(1 + 5 + node_len) + b"\x0a" + varint(node_len)
    assert len(head) == 14
    path = _sparse(tmp_path / "big.onnx", head, size)
    result, elapsed_s, peak = _sniff_measured(path)
    assert result == "onnx", result
    assert elapsed_s < 2 and peak < 1024**2, (elapsed_s, peak)  # a few reads of 10 bytes, not 1 GiB


@pytest.mark.parametrize("filename, fragment", [
    ("big.py", "1073741824 bytes is more than the limit of 16777216 bytes"),
    ("big.ipynb", "more than the limit of 67108864 bytes"),
    ("big.yaml", "more than the limit of 1048576 bytes"),
    ("big.pt", "not a zip archive"),  # only the last 64 KiB are read, looking for the end record
    ("big.onnx", "is not a field of a message"),  # a hole of zeros: tag 0 at byte 0
])
def test_huge_files_cost_bounded_memory(tmp_path, filename, fragment):
    path = _sparse(tmp_path / filename, b"", GIB)
    result, elapsed_s, peak = _sniff_measured(path)
    assert isinstance(result, ArtifactError) and fragment in str(result), result
    assert elapsed_s < 2 and peak < 1024**2, (elapsed_s, peak)


def test_a_zip_bomb_with_a_1_gib_tail_is_judged_from_its_directory(tmp_path):
    # an archive that is 1 GiB on disk, its central directory at the end: what it declares decides, not its bytes
    archive = stored_zip(TS, {b"archive/data.pkl": 2**40})
    first_entry = archive.index(b"PK\x01\x02")
    directory = archive[first_entry:]
    offset = GIB - len(directory)
    directory = directory[:-6] + offset.to_bytes(4, "little") + directory[-2:]  # the EOCD's cd_offset
    path = _sparse(tmp_path / "m.pt", archive[:first_entry], GIB, directory)
    result, elapsed_s, peak = _sniff_measured(path)
    assert isinstance(result, ArtifactError) and "declare 1099511627" in str(result), result
    assert elapsed_s < 2 and peak < 1024**2, (elapsed_s, peak)


def test_field_tables_match_onnx_proto():
    onnx = pytest.importorskip("onnx")
    for table, message in ((MODEL_FIELDS, onnx.ModelProto), (GRAPH_FIELDS, onnx.GraphProto)):
        declared = {f.number: (f.name, 2 if f.type in (f.TYPE_MESSAGE, f.TYPE_STRING, f.TYPE_BYTES) else 0)
                    for f in message.DESCRIPTOR.fields}
        assert table == declared


def test_what_the_sniff_accepts_onnx_parses_and_a_real_model_passes(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    onnx.checker.check_model(onnx.load_from_string(onnx_model()))  # the hand-written model is a real one
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    model = helper.make_model(graph, producer_name="shoal-test", opset_imports=[helper.make_opsetid("", 13)])
    model.metadata_props.add(key="k", value="v")
    path = tmp_path / "mul.onnx"
    onnx.save(model, path)
    assert sniff_artifact(path) == "onnx"


def test_a_real_torchscript_archive_passes_and_a_checkpoint_does_not(tmp_path):
    torch = pytest.importorskip("torch")
    module = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 2)))
    module.save(str(tmp_path / "m.pt"))
    assert sniff_artifact(tmp_path / "m.pt") == "torchscript"
    torch.save(module.state_dict(), tmp_path / "state.pt")
    with pytest.raises(ArtifactError, match="no constants.pkl"):
        sniff_artifact(tmp_path / "state.pt")


def test_the_torchscript_loader_refuses_a_bomb_before_torch_opens_it(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from serving.models import LoadError, LoadOptions, create_model

    def must_not_open(*args, **kwargs):
        raise AssertionError("torch.jit.load opened a refused archive")

    monkeypatch.setattr(torch.jit, "load", must_not_open)
    path = tmp_path / "bomb.pt"
    path.write_bytes(stored_zip(TS, {b"archive/data.pkl": 2**40}))
    model = create_model(str(path), "bomb", None, LoadOptions())
    with pytest.raises(LoadError, match=r"a zip bomb\?"):
        model.load()
    monkeypatch.undo()  # a real archive passes the check and loads
    module = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 2)))
    module.save(str(tmp_path / "real.pt"))
    real = create_model(str(tmp_path / "real.pt"), "real", None, LoadOptions())
    real.load()
    assert real.predict({"input": torch.zeros(3, 4).numpy()})["OUTPUT__0"].shape == (3, 2)


def test_a_refused_upload_keeps_nothing(tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")
    writer = store.writer("model.onnx")
    writer.write(b"this is not onnx")
    with pytest.raises(ArtifactError, match="not a serialized onnx.ModelProto"):
        try:
            writer.commit(check=sniff_artifact)
        finally:
            writer.abort()
    assert os.listdir(tmp_path / "artifacts" / "tmp") == [] and not (tmp_path / "artifacts" / "sha256").exists()
    writer = store.writer("model.onnx")
    writer.write(onnx_model())
    artifact = writer.commit(check=sniff_artifact)
    assert store.path(artifact.ref).read_bytes() == onnx_model()


def test_the_specs_loader_decides_the_kind_at_deploy(tmp_path):
    # an ONNX model stored under a TorchScript name: refused by its name, passed by `loader: onnx`
    path = tmp_path / "model.pt"
    path.write_bytes(onnx_model())
    with pytest.raises(ArtifactError, match="not a zip archive"):
        sniff_artifact(path)
    assert sniff_artifact(path, loader="onnx") == "onnx"
    path.write_bytes(b"neither")
    with pytest.raises(ArtifactError, match="not a serialized onnx.ModelProto"):
        sniff_artifact(path, loader="onnx")


@pytest.mark.parametrize("declared, size, refused", [
    # a large TorchScript model declares about its size: 5 GiB in a 5 GiB file is no bomb
    (5 * GIB, 5 * GIB, False),
    # 5 GiB in 60 MiB: 5 GiB > 100 x 60 MiB = 5.86 GiB? no: 5 GiB < 5.86 GiB, within the ratio
    (5 * GIB, 60 * 1024**2, False),
    # 5 GiB in 50 MiB: 100 x 50 MiB = 4.88 GiB < 5 GiB: a bomb
    (5 * GIB, 50 * 1024**2, True),
    # under the 64 MiB floor any ratio passes: 60 MiB declared in 1 KB
    (60 * 1024**2, 1024, False),
])
def test_a_zip_is_judged_by_its_ratio_with_no_cap_of_its_own(declared, size, refused):
    from functions.sniff import _check_unpacked

    if refused:
        with pytest.raises(ArtifactError, match="a zip bomb"):
            _check_unpacked(declared, size, 3, "m.pt", SniffLimits())
    else:
        _check_unpacked(declared, size, 3, "m.pt", SniffLimits())
