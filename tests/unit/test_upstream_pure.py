"""The gateway's request-target and response-header handling (pure parts)."""

from __future__ import annotations

import asyncio

import pytest

from serving.gateway import _function_of, _raw_target
from serving.protocol.errors import InvalidInput
from serving.upstream import UpstreamPool, _parse_headers


def test_headers_parse_and_drop_hop_by_hop():
    head = b"content-type: application/json\r\ncontent-length: 12\r\nconnection: close\r\nx-a: 1\r\n\r\n"
    headers, length, chunked, close = _parse_headers(head)
    assert headers == [(b"content-type", b"application/json"), (b"x-a", b"1")]
    assert (length, chunked, close) == (12, False, True)


def test_chunked_and_missing_length():
    headers, length, chunked, close = _parse_headers(b"transfer-encoding: chunked\r\n\r\n")
    assert chunked and length is None and headers == []


def test_header_without_colon_is_malformed():
    with pytest.raises(ValueError, match="malformed response header"):
        _parse_headers(b"HTTP/1.1 200 OK\r\n\r\n")


@pytest.mark.parametrize(
    "scope,target",
    [
        ({"raw_path": b"/v2/models/m/infer", "path": "/v2/models/m/infer"}, "/v2/models/m/infer"),
        # percent-encoded CR LF stays encoded: it can never split the request line
        ({"raw_path": b"/v2/models/m/x%0d%0aGET", "path": "/v2/models/m/x\r\nGET"}, "/v2/models/m/x%0d%0aGET"),
        ({"raw_path": b"/v2/models/m", "path": "/v2/models/m", "query_string": b"a=1"}, "/v2/models/m?a=1"),
    ],
    ids=["plain", "encoded-crlf", "query"],
)
def test_raw_target(scope, target):
    assert _raw_target(scope) == target


def test_raw_target_refuses_control_characters():
    with pytest.raises(InvalidInput):
        _raw_target({"raw_path": b"/v2/models/m/a b", "path": "/v2/models/m/a b"})


@pytest.mark.parametrize(
    "path,name",
    [("/v2/models/digits/infer", "digits"), ("/v1/models/digits:predict", "digits"),
     ("/v2/models/digits/versions/1/infer", "digits"), ("/v2/models/", None), ("/v3/x", None)],
)
def test_function_of(path, name):
    assert _function_of(path) == name


class _Writer:
    def __init__(self, fails: bool) -> None:
        self.fails, self.sent = fails, b""

    def is_closing(self) -> bool:
        return False  # a replica killed just after this check: the write is what finds out

    def write(self, data: bytes) -> None:
        if self.fails:  # what uvloop raises on a transport whose peer is gone
            raise RuntimeError("unable to perform operation on <UnixTransport closed=True>; the handler is closed")
        self.sent += data

    def close(self) -> None:
        pass


def test_a_pooled_connection_closed_under_the_write_is_replaced_not_a_500(monkeypatch):
    # the chaos test's one 500 in 4,800 requests: a replica killed between the pool's check and
    # the write; nothing was sent, so the request goes on a fresh connection
    async def run():
        pool = UpstreamPool("127.0.0.1", 9)
        stale = asyncio.StreamReader()
        pool._idle.append((stale, _Writer(fails=True)))
        fresh = asyncio.StreamReader()
        fresh.feed_data(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        writer = _Writer(fails=False)

        async def open_connection(host, port):
            return fresh, writer

        monkeypatch.setattr(asyncio, "open_connection", open_connection)
        response = await pool.request("POST", "/v2/models/m/infer", [], b"{}", timeout_s=5.0)
        return response, writer.sent

    response, sent = asyncio.run(run())
    assert (response.status, response.body) == (200, b"ok") and sent.startswith(b"POST /v2/models/m/infer")
