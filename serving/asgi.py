"""The ASGI edge every Shoal server shares: reading a bounded body and writing a response.

The replica, the gateway, shoal up's server and the cluster roles answer through
`send_response` and `send_error`, so an error looks the same wherever it comes from: the
status, headers and `{"error": "..."}` body of serving/protocol/errors.py's table.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Iterable

from serving.protocol.errors import ClientDisconnected, PayloadTooLarge, error_response

Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
JSON = b"application/json"


async def send_response(send: Send, status: int, body: bytes, content_type: bytes | None = JSON,
                        headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """One whole response: status, Content-Type (None: `headers` carry their own, as a proxied
    answer does), Content-Length, `headers`, then the body."""
    out = [(b"content-length", str(len(body)).encode()), *headers]
    if content_type is not None:
        out.insert(0, (b"content-type", content_type))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, exc: BaseException) -> int:
    """Answer `exc` as the error table says; the status, for the caller's metrics."""
    status, headers, body = error_response(exc)
    encoded = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    await send_response(send, status, body, JSON, encoded)
    return status


async def read_body(receive: Receive, limit: int, declared: str | None = None) -> bytes:
    """The whole request body, refused with 413 as soon as it passes `limit` bytes
    (at once when the declared Content-Length already does)."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected("client disconnected before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
