"""A lean HTTP/1.1 keep-alive load client for benchmarks (loopback only, bounded): one
pre-encoded request over N persistent connections, closed loop (or open loop with `--rate`),
for a count or a time, recording each latency. It runs in its own process, pinned to its own
core by the caller, so that its cost stays out of the server's way and is the same for every
server measured. Prints `{"latencies_s": [...], "errors": n, "statuses": {...}, "seconds": s}`.

    python -m loadtests.bench.httpload --port P --path /v2/models/m/infer --body-file F \\
        --connections 32 --seconds 5 [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def build_request(host: str, port: int, path: str, body: bytes, content_type: str = "application/json",
                  extra_headers: list[str] = ()) -> bytes:
    extra = "".join(f"{h}\r\n" for h in extra_headers)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("server closed the connection")
    status = int(status_line.split(b" ", 2)[1])
    length = None
    chunked = False
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:  # Ray Serve's proxy answers chunked
        while (size := int((await reader.readline()).split(b";")[0], 16)) > 0:
            await reader.readexactly(size + 2)
        await reader.readline()
    elif length is None:
        raise ConnectionError("response with neither Content-Length nor chunked encoding")
    else:
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


async def run_open_loop(host: str, port: int, request: bytes, rate: float, seconds: float,
                        timeout_s: float = 10.0) -> dict:
    """Open loop: requests start on a fixed schedule whatever the responses do, so an
    overloaded server shows up as latency instead of a slower client. Latency counts
    from each request's scheduled start (no coordinated omission)."""
    if host not in LOOPBACK:
        raise ValueError(f"benchmarks send traffic only to loopback, not {host!r}")
    idle: list = []
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0

    async def one(scheduled: float) -> None:
        nonlocal errors
        conn = None
        try:
            async with asyncio.timeout(timeout_s):  # bounded: an overloaded server cannot hang the run
                conn = idle.pop() if idle else await asyncio.open_connection(host, port)
                conn[1].write(request)
                status = await _read_response(conn[0])
        except (ConnectionError, OSError, asyncio.IncompleteReadError, TimeoutError):
            errors += 1
            if conn is not None:
                conn[1].close()
            return
        latencies.append(time.perf_counter() - scheduled)
        statuses[status] = statuses.get(status, 0) + 1
        idle.append(conn)

    count = int(rate * seconds)
    start = time.perf_counter()
    tasks = []
    for i in range(count):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0.002:
            await asyncio.sleep(delay - 0.002)  # timers wake late by up to a millisecond...
        while time.perf_counter() < scheduled:  # ...so the last stretch is waited out exactly
            await asyncio.sleep(0)
        tasks.append(asyncio.ensure_future(one(scheduled)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    for _, writer in idle:
        writer.close()
    return {"latencies_s": latencies, "statuses": statuses, "errors": errors, "seconds": elapsed,
            "offered_rps": rate, "achieved_rps": len(latencies) / elapsed}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--header", action="append", default=[], help="extra request header 'Name: value'")
    p.add_argument("--body-file", required=True)
    p.add_argument("--connections", type=int, default=1)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--requests", type=int, default=10**9)
    p.add_argument("--rate", type=float, help="open loop at this many requests per second (else closed loop)")
    args = p.parse_args()
    with open(args.body_file, "rb") as f:
        request = build_request(args.host, args.port, args.path, f.read(), extra_headers=args.header)
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        if args.rate:
            result = runner.run(run_open_loop(args.host, args.port, request, args.rate, args.seconds))
        else:
            result = runner.run(run_load(args.host, args.port, request, args.connections, args.seconds, args.requests))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
