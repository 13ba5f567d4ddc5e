"""A lean HTTP/1.1 keep-alive load client for benchmarks (loopback only, bounded).

It sends one pre-encoded request over N persistent connections, closed-loop,
for a bounded count or time, and records each latency. It runs in its own
process (pinned to its own core by the caller) so that client cost stays out of
the server's way and is the same for every server measured.

    python -m loadtests.bench.httpload --port P --path /v2/models/m/infer --body-file F \
        --connections 32 --seconds 5 [--requests N]
prints a JSON object: {"latencies_s": [...], "errors": n, "statuses": {...}, "seconds": s}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def build_request(host: str, port: int, path: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("server closed the connection")
    status = int(status_line.split(b" ", 2)[1])
    length = None
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    if length is None:
        raise ConnectionError("response without Content-Length")
    await reader.readexactly(length)
    return status


async def _worker(host, port, request, deadline, budget, latencies, statuses):
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < deadline and budget[0] > 0:
            budget[0] -= 1
            start = time.perf_counter()
            writer.write(request)
            status = await _read_response(reader)
            latencies.append(time.perf_counter() - start)
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


async def run_load(host: str, port: int, request: bytes, connections: int, seconds: float, requests: int) -> dict:
    if host not in LOOPBACK:
        raise ValueError(f"benchmarks send traffic only to loopback, not {host!r}")
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    budget = [requests]
    start = time.perf_counter()
    deadline = start + seconds
    results = await asyncio.gather(
        *(_worker(host, port, request, deadline, budget, latencies, statuses) for _ in range(connections)),
        return_exceptions=True,
    )
    elapsed = time.perf_counter() - start
    errors = sum(1 for r in results if isinstance(r, BaseException))
    return {"latencies_s": latencies, "statuses": statuses, "errors": errors, "seconds": elapsed}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--body-file", required=True)
    p.add_argument("--connections", type=int, default=1)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--requests", type=int, default=10**9)
    args = p.parse_args()
    with open(args.body_file, "rb") as f:
        request = build_request(args.host, args.port, args.path, f.read())
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        result = runner.run(run_load(args.host, args.port, request, args.connections, args.seconds, args.requests))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
