"""Hostile artifacts against the real control API (issue 7): `shoal up`'s ControlPlane in-process, its ASGI
app driven by httpx's ASGITransport (no lifespan: no controller loop, no replica is ever started).

Each hostile artifact is refused with a 4xx and a message that names what is wrong: at upload (the first
request of a deploy) for bytes that are not what their name says, at the PUT for a pickle without trust,
a notebook, or a stored artifact that fails the sniff. File names and artifact references that point
anywhere else are refused. And after each test nothing was written outside the state directory: the rest
of tmp_path is unchanged, the process's default temporary folder (pointed at an empty folder) holds
nothing new, and the state directory holds only what `shoal up` keeps there.

One folder outside the state directory is `shoal up`'s own: when the state directory's path is too long
for a Unix socket's path (108 bytes), the local backend keeps replicas' sockets in a private `shoal-*`
temporary folder (mode 0700, removed at stop). It is made when the plane is built, before any request,
so the snapshot is taken after that, and the folder is checked to be that one and empty."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import tracemalloc
from pathlib import Path

import httpx
import pytest

from deploy.local.server import ControlPlane
from tests.conftest import EXAMPLES
from tests.fakes.artifacts import TORCHSCRIPT_MEMBERS, deflate_bomb, notebook, onnx_model, stored_zip

HEX = "ab" * 32
HANDLER = b"def handler(context, event):\n    return event.body\n"


def _tree(root: Path, exclude: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` but `exclude`, with its size and mode."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == exclude.parent and exclude.name in dirnames:
            dirnames.remove(exclude.name)
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (st.st_size, st.st_mode)
    return out


class Api:
    def __init__(self, tmp_path: Path):
        self.root = tmp_path
        self.state = tmp_path / "state"
        self.systmp = tmp_path / "default-tmp"
        self.systmp.mkdir()
        self.plane = ControlPlane(self.state, devices="cpu")
        self.sockets = self.plane.backend.socket_dir
        if not self.sockets.is_relative_to(self.state):  # see the module's docstring
            assert self.sockets.parent == self.systmp and self.sockets.stat().st_mode & 0o777 == 0o700
        self.before = _tree(tmp_path, self.state)
        self.runner = asyncio.Runner()
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.plane), base_url="http://shoal",
                                        headers={"authorization": f"Bearer {self.plane.token}"})
        self.kept: set[str] = set()  # file names of the artifacts the API accepted

    def request(self, method: str, url: str, **kwargs) -> httpx.Response:
        return self.runner.run(self.client.request(method, url, **kwargs))

    def upload(self, filename: str, data: bytes) -> httpx.Response:
        # the query as given, not re-encoded: '..%2Fx.onnx' reaches the server as the client wrote it
        r = self.request("POST", f"/api/v1/artifacts?filename={filename}", content=data)
        if r.status_code == 200:
            self.kept.add(r.json()["ref"].rsplit("/", 1)[-1])
        return r

    def put(self, name: str, spec: dict) -> httpx.Response:
        return self.request("PUT", f"/api/v1/functions/{name}", json=spec)

    def get(self, url: str) -> httpx.Response:
        return self.request("GET", url)

    def assert_contained(self) -> None:
        assert _tree(self.root, self.state) == self.before, "a file was written outside the state directory"
        assert set(os.listdir(self.systmp)) <= {self.sockets.name} and not any(self.sockets.iterdir())
        artifacts = self.state / "artifacts"
        assert os.listdir(artifacts / "tmp") == []  # no half-written or refused upload left behind
        for path in self.state.rglob("*"):
            relative = path.relative_to(self.state)
            if path.is_dir() or relative.parts[0] != "artifacts":
                # emulated: the emulated devices' compute files (deploy.local.backend)
                assert relative.parts[0] in ("artifacts", "token", "lock", "logs", "sockets", "emulated") or \
                    relative.name.startswith("registry.db"), relative
                continue
            # artifacts/sha256/<2 hex>/<64 hex>/<name>, of an upload the API accepted
            _, kind, prefix, digest, name = relative.parts
            assert kind == "sha256" and digest.startswith(prefix) and len(digest) == 64 and name in self.kept, relative

    def close(self) -> None:
        self.runner.run(self.client.aclose())
        self.runner.run(self.plane.scraper.close())
        self.runner.close()
        self.plane.registry.close()
        self.plane._lock.close()


@pytest.fixture
def api(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "default-tmp"))
    a = Api(tmp_path)
    yield a
    a.close()


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return deflate_bomb(80)  # 80 MiB of zeros in about 80 KB


HOSTILE = [
    ("onnx-that-is-text", "model.onnx", b"this is not onnx", "model.onnx is not a serialized onnx.ModelProto"),
    ("onnx-that-is-a-pickle", "model.onnx", b"\x80\x04K\x01.", "is not a field of a message"),
    ("onnx-truncated", "model.onnx", onnx_model()[:40], "past the end at 40"),
    ("pt-not-a-zip", "model.pt", b"\x80\x02legacy", "not a zip archive"),
    ("pt-declares-1-tib", "model.pt", stored_zip(TORCHSCRIPT_MEMBERS, {b"archive/data.pkl": 2**40}), "zip bomb"),
    ("pt-member-dotdot", "model.pt", stored_zip(TORCHSCRIPT_MEMBERS + [(b"../../x", b"x")]), "'..' part"),
    ("pt-member-absolute", "model.pth", stored_zip(TORCHSCRIPT_MEMBERS + [(b"/etc/cron.d/x", b"x")]), "absolute"),
    ("pt-checkpoint", "model.pt", stored_zip([(b"archive/data.pkl", b".")]), "no constants.pkl"),
    ("ipynb-not-json", "nb.ipynb", b"print('hi')", "not JSON"),
    ("py-not-utf8", "handler.py", b"\xff\xfe" + HANDLER, "is not UTF-8"),
    ("py-syntax", "handler.py", b"def handler(:\n", "syntax error on line 1"),
    ("yaml-not-a-profile", "profile.yaml", b"kind: model\n", "found kind 'model'"),
]


@pytest.mark.parametrize("filename, data, fragment", [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_hostile_artifacts_are_refused_at_upload(api, filename, data, fragment):
    r = api.upload(filename, data)
    assert r.status_code == 400 and fragment in r.json()["error"], r.text
    assert not (api.state / "artifacts" / "sha256").exists()  # nothing of it was kept
    api.assert_contained()


def test_a_zip_bomb_is_refused_at_once_with_bounded_memory(api, bomb):
    tracemalloc.start()
    started = time.monotonic()
    try:
        r = api.upload("model.pt", bomb)
        elapsed_s, peak = time.monotonic() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"zip bomb ({len(bomb)} bytes declaring 80 MiB): {r.status_code} in {elapsed_s:.3f} s, "
          f"{peak / 2**20:.1f} MiB traced at the peak")
    assert r.status_code == 400 and "declare 83886084 bytes uncompressed" in r.json()["error"], r.text
    assert elapsed_s < 3, elapsed_s
    assert peak < 16 * 1024**2, f"{peak / 2**20:.1f} MiB traced: the 80 MiB inside were inflated?"
    api.assert_contained()


NAMES = [  # (the query as sent, the name the server decodes from it)
    ("../x.onnx", "../x.onnx"), ("..%2Fx.onnx", "../x.onnx"), ("%2E%2E%2Fx.onnx", "../x.onnx"),
    ("..%252Fx.onnx", "..%2Fx.onnx"), ("/etc/passwd", "/etc/passwd"), ("%2Fetc%2Fpasswd", "/etc/passwd"),
    ("a/b.onnx", "a/b.onnx"), ("x%00.onnx", "x\x00.onnx"), ("x.onnx%0A", "x.onnx\n"), ("..", ".."),
    ("....onnx", "....onnx"), (".hidden.onnx", ".hidden.onnx"), ("C:%5Cx.onnx", "C:\\x.onnx"),
    ("x%5C..%5Cy.onnx", "x\\..\\y.onnx"), ("", ""), ("x.exe", "x.exe"),
]


@pytest.mark.parametrize("query, decoded", NAMES, ids=[q or "empty" for q, _ in NAMES])
def test_file_names_that_point_elsewhere_are_refused(api, query, decoded):
    r = api.upload(query, onnx_model())
    error = r.json()["error"]
    assert r.status_code == 400 and repr(decoded) in error, r.text  # the name the server saw, refused
    assert "is invalid" in error or "unknown type" in error, error
    for folder in (Path.cwd(), api.root, api.state, api.state / "artifacts"):
        assert not (folder / "x.onnx").exists()
    api.assert_contained()


@pytest.mark.parametrize("artifact, fragment", [
    (f"sha256:{HEX}/../../x.onnx", "is invalid"),
    (f"sha256:{HEX}/..", "is invalid"),
    ("sha256:../x.onnx", "is invalid"),
    ("/etc/passwd", "is invalid"),
    (f"sha256:{HEX}/x.onnx\n", "is invalid"),
    (f"sha256:{HEX}/x.onnx", "is not in the store: upload it first"),
])
def test_artifact_references_that_point_elsewhere_are_refused(api, artifact, fragment):
    r = api.put("f", {"artifact": artifact})
    assert r.status_code == 400 and fragment in r.json()["error"], r.text
    assert api.get("/api/v1/functions/f").status_code == 404
    api.assert_contained()


def test_function_names_that_point_elsewhere_are_refused(api):
    ref = api.upload("model.onnx", onnx_model()).json()["ref"]
    for name in ("..%2F..%2Fetc", "Bad_Name", "a.b", "x%00"):
        r = api.put(name, {"artifact": ref})
        assert r.status_code in (400, 404), (name, r.text)  # an encoded '/' may not even route
    assert api.get("/api/v1/functions").json() == {"functions": []}
    api.assert_contained()


def test_a_pickle_needs_trust_even_under_another_name(api):
    pickled = api.upload("model.pkl", b"\x80\x04K\x01.").json()["ref"]  # stored, never opened
    r = api.put("pickled", {"artifact": pickled})
    assert r.status_code == 400 and "refused without --trust" in r.json()["error"], r.text
    # an .onnx name does not help when the sklearn loader would unpickle it
    renamed = api.upload("model.onnx", onnx_model()).json()["ref"]
    r = api.put("renamed", {"artifact": renamed, "loader": "sklearn"})
    assert r.status_code == 400 and "refused without --trust" in r.json()["error"], r.text
    assert api.get("/api/v1/functions").json() == {"functions": []}
    api.assert_contained()


def test_a_stored_artifact_is_sniffed_again_at_deploy(api):
    # as if stored before the upload check existed: in the store's layout, but never through the API
    ref = f"sha256:{HEX}/model.onnx"
    path = api.plane.store.path(ref)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not onnx")
    api.kept.add("model.onnx")
    r = api.put("stale", {"artifact": ref})
    assert r.status_code == 400 and "model.onnx is not a serialized onnx.ModelProto" in r.json()["error"], r.text
    assert api.get("/api/v1/functions/stale").status_code == 404
    api.assert_contained()


def test_a_notebook_is_kept_but_not_deployed(api):
    ref = api.upload("nb.ipynb", notebook(["def handler(context, event):\n    return 1"])).json()["ref"]
    r = api.put("nb", {"artifact": ref})
    assert r.status_code == 400 and "convert it to a handler .py" in r.json()["error"], r.text
    api.assert_contained()


@pytest.mark.parametrize("filename, data", [
    ("model.onnx", onnx_model()),
    ("model.pt", stored_zip(TORCHSCRIPT_MEMBERS)),
    ("handler.py", HANDLER),
    ("resnet.yaml", (EXAMPLES / "emulated_resnet.yaml").read_bytes()),
], ids=["onnx", "torchscript", "handler", "profile"])
def test_good_artifacts_still_deploy(api, filename, data):
    r = api.upload(filename, data)
    assert r.status_code == 200, r.text
    r = api.put("good", {"artifact": r.json()["ref"]})
    assert r.status_code == 200 and r.json()["revision"] == 1, r.text
    api.assert_contained()
