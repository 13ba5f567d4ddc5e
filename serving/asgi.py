"""Small ASGI helpers shared by the replica and the gateway."""

from __future__ import annotations

from typing import Awaitable, Callable

from serving.protocol.errors import ClientDisconnected, PayloadTooLarge

Receive = Callable[[], Awaitable[dict]]


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
