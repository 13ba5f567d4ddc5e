"""Pooled HTTP/1.1 keep-alive connections from the gateway to one replica: plain requests with
Content-Length (or chunked) responses over reused connections, not a general-purpose client, so
the gateway adds at most a fraction of a millisecond. A request that fails on a reused
connection before any byte of answer was never read (the replica closed an idle connection), so
it is safe to resend: `UpstreamUnavailable.retryable` says so.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
     b"proxy-connection", b"host", b"content-length", b"expect"}
)


class UpstreamUnavailable(Exception):
    """The replica could not be reached or dropped the connection.
    `retryable`: the replica did not read the request, so another may take it.
    `dropped`: it may have read it, then closed the connection without a byte of answer
    (it died: killed, out of memory, or the request itself crashed it)."""

    def __init__(self, message: str, retryable: bool, dropped: bool = False):
        super().__init__(message)
        self.retryable = retryable
        self.dropped = dropped


@dataclass(slots=True)
class UpstreamResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    close: bool = False  # the replica closes the connection after this response


class UpstreamPool:
    def __init__(self, host: str, port: int, max_idle: int = 256, connect_timeout_s: float = 2.0,
                 uds: str | None = None):
        self.host = host
        self.port = port
        self.uds = uds  # a Unix socket of a replica on this machine: cheaper than loopback TCP
        self.max_idle = max_idle
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._host_header = f"{host}:{port}".encode()
        self.closed = False

    async def request(self, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes,
                      timeout_s: float) -> UpstreamResponse:
        """Send one request; a stale pooled connection is replaced transparently once."""
        dropped = None  # a reused connection closed without an answer: stale, or the replica died on it
        for attempt in range(2):
            reused = bool(self._idle)
            try:
                reader, writer = await self._connection()
            except UpstreamUnavailable as exc:
                if dropped is None:
                    raise
                # it closed the connection and now refuses new ones: it died, maybe of this request
                raise UpstreamUnavailable(f"replica {self.host}:{self.port} closed the connection ({dropped}) "
                                          f"and is gone: {exc}", False, dropped=True) from None
            try:
                async with asyncio.timeout(timeout_s):  # no extra task per request, unlike wait_for
                    response = await self._exchange(reader, writer, method, path, headers, body)
            except TimeoutError:  # before OSError, its base class: no answer in time is a timeout (504)
                writer.close()
                raise
            except _NothingRead as exc:
                writer.close()
                if reused and attempt == 0:
                    dropped = str(exc)
                    continue  # the replica closed an idle connection: try a fresh one
                # on a fresh connection the replica may have read the request and died on it:
                # the gateway sends it to one other replica at most, so a request that kills
                # replicas can take down two, never the whole function
                raise UpstreamUnavailable(f"replica {self.host}:{self.port} closed the connection: {exc}", False,
                                          dropped=True) from None
            except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
                writer.close()
                raise UpstreamUnavailable(f"replica {self.host}:{self.port} failed mid-response: {exc!r}", False) from None
            except BaseException:
                writer.close()  # timeout or cancellation: the connection's state is unknown
                raise
            self._release(reader, writer, response)
            return response
        raise AssertionError("unreachable")

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self._idle:
            reader, writer = self._idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer
            writer.close()
        try:
            opening = (asyncio.open_unix_connection(self.uds) if self.uds
                       else asyncio.open_connection(self.host, self.port))
            return await asyncio.wait_for(opening, self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise UpstreamUnavailable(f"cannot connect to replica {self.host}:{self.port}: {exc!r}", True) from None

    async def _exchange(self, reader, writer, method, path, headers, body) -> UpstreamResponse:
        head = [f"{method} {path} HTTP/1.1\r\n".encode(), b"host: ", self._host_header, b"\r\n"]
        for name, value in headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"content-length: %d\r\n\r\n" % len(body))
        try:
            writer.write(b"".join(head) + body)
        except RuntimeError as exc:  # uvloop: "unable to perform operation on ...; the handler is closed"
            raise _NothingRead(f"the connection closed before the request was sent: {exc}") from None
        while True:
            try:
                status_line = await reader.readline()
            except (ConnectionError, OSError) as exc:
                raise _NothingRead(repr(exc)) from None
            if not status_line:
                raise _NothingRead("EOF before the status line")
            if not status_line.startswith(b"HTTP/1."):
                raise ValueError(f"malformed status line {status_line[:40]!r}")
            status = int(status_line.split(b" ", 2)[1])
            response_headers, length, chunked, close = _parse_headers(await reader.readuntil(b"\r\n\r\n"))
            if not 100 <= status < 200:  # skip interim responses (100 Continue)
                break
        if method == "HEAD" or status in (204, 304):
            payload = b""
        elif chunked:
            payload = await _read_chunked(reader)
        elif length is not None:
            payload = await reader.readexactly(length) if length else b""
        else:  # neither length nor chunks: the body runs to the end of the connection
            payload, close = await reader.read(), True
        return UpstreamResponse(status, response_headers, payload, close)

    def _release(self, reader, writer, response: UpstreamResponse) -> None:
        # bytes left in the buffer mean the replica sent more than one response:
        # such a connection is out of step and must not serve another request
        leftover = len(getattr(reader, "_buffer", b""))
        if response.close or leftover or self.closed or len(self._idle) >= self.max_idle:
            writer.close()
        else:
            self._idle.append((reader, writer))

    def close(self) -> None:
        self.closed = True
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


class _NothingRead(Exception):
    pass


def _parse_headers(head: bytes):
    """Headers of a response, read in one piece up to the blank line."""
    headers: list[tuple[bytes, bytes]] = []
    length = None
    chunked = close = False
    for line in head.split(b"\r\n"):
        if not line:
            continue
        name, colon, value = line.partition(b":")
        if not colon:
            raise ValueError(f"malformed response header {line[:40]!r}")
        name, value = name.strip().lower(), value.strip()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif name == b"connection" and value.lower() == b"close":
            close = True
        if name not in HOP_BY_HOP:
            headers.append((name, value))
    return headers, length, chunked, close


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readline()).split(b";")[0].strip(), 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers, up to the blank line that ends the message
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readline()
