"""The gateway's request-target and response-header handling (pure parts)."""

from __future__ import annotations

import pytest

from serving.gateway import _function_of, _raw_target
from serving.protocol.errors import InvalidInput
from serving.upstream import _parse_headers


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
