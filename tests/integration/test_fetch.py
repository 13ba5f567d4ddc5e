"""`shoal fetch`: an artifact from a URL (a local HTTP server on loopback), checked by its sha256."""

from __future__ import annotations

import hashlib
import http.server
import threading
from functools import partial

import pytest

from deploy.cli.fetch import main


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "model.onnx").write_bytes(b"onnx bytes " * 1000)
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}", hashlib.sha256(b"onnx bytes " * 1000).hexdigest()
    httpd.shutdown()


def test_downloads_checks_and_keeps(server, tmp_path, capsys):
    url, digest = server
    out = tmp_path / "artifacts" / "model.onnx"
    assert main([f"{url}/model.onnx", "--sha256", digest, "--out", str(out)]) == 0
    assert out.read_bytes() == b"onnx bytes " * 1000 and "downloaded" in capsys.readouterr().out
    assert main([f"{url}/model.onnx", "--sha256", digest, "--out", str(out)]) == 0
    assert "already there" in capsys.readouterr().out  # the second time nothing is downloaded


@pytest.mark.parametrize("path, digest, message", [
    ("/model.onnx", "0" * 64, "is not the expected 000"),
    ("/missing.onnx", None, "404"),
    ("/model.onnx", "XYZ", "64 lowercase hex digits"),
])
def test_a_bad_download_never_becomes_a_model(server, tmp_path, capsys, path, digest, message):
    url, good = server
    out = tmp_path / "model.onnx"
    assert main([url + path, "--sha256", digest or good, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob("*.part"))


def test_size_limit(server, tmp_path, capsys):
    url, digest = server
    assert main([f"{url}/model.onnx", "--sha256", digest, "--out", str(tmp_path / "m"), "--max-gib", "0.000001"]) == 2
    assert "more than 1073 bytes" in capsys.readouterr().err
