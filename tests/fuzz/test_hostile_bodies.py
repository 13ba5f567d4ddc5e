"""Hostile request bodies (issue 7): a gzip bomb is refused with 413 before it is inflated past
the body limit, quickly, without the replica's memory growing by the bomb's size, and the replica
keeps serving."""

from __future__ import annotations

import time
import zlib

import httpx
import psutil
import pytest

from tests.conftest import start_replica

pytestmark = pytest.mark.integration

BODY = b'{"inputs": [{"name": "X", "shape": [1, 64], "datatype": "FP32", "data": [' + b"0," * 63 + b"0]}]}"


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """One gzip member: 512 MiB of zeros in about 0.5 MB, 8 times the default 64 MiB body limit inflated."""
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b"\0" * (16 * 1024**2)
    return b"".join([*(c.compress(chunk) for _ in range(32)), c.flush()])


def test_gzip_bomb_is_refused_without_inflating_it(digits_onnx, bomb):
    replica = start_replica(digits_onnx, "--name", "digits")
    try:
        rss_before = psutil.Process(replica.proc.pid).memory_info().rss
        started = time.monotonic()
        r = httpx.post(f"{replica.url}/v2/models/digits/infer", content=bomb,
                       headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}, timeout=30)
        elapsed = time.monotonic() - started
        assert r.status_code == 413 and "exceeds the limit" in r.json()["error"], r.text
        assert elapsed < 5
        grown = psutil.Process(replica.proc.pid).memory_info().rss - rss_before
        assert grown < 300 * 1024**2, f"RSS grew by {grown / 2**20:.0f} MiB"  # not by the bomb's 512 MiB
        ok = httpx.post(f"{replica.url}/v2/models/digits/infer", content=BODY,
                        headers={"Content-Type": "application/json"}, timeout=10)
        assert ok.status_code == 200  # and it still serves
        print(f"gzip bomb: {r.status_code} in {elapsed:.2f} s, replica RSS grew {grown / 2**20:.0f} MiB")
    finally:
        assert replica.stop(15, 30) == 0
