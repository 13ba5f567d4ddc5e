"""The gateway in-process against small HTTP servers on loopback: holding while cold,
retries on another replica, draining, and the bounded activator queue."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from serving.gateway import Gateway, GatewayConfig

pytestmark = pytest.mark.integration

REQUEST = b'{"inputs": []}'


async def fake_replica(delay_s: float = 0.0):
    """A tiny HTTP/1.1 server: answers every request with 200 and its own name."""
    served = []

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                await asyncio.sleep(delay_s)
                body = b'{"ok": true}'
                served.append(1)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], served


class Scope:
    """Drive Gateway.handle like uvicorn would, and collect the response."""

    def __init__(self, gateway: Gateway, path: str = "/v2/models/f/infer", method: str = "POST"):
        self.gateway = gateway
        self.path = path
        self.method = method

    async def call(self) -> tuple[int, dict[bytes, bytes], bytes]:
        scope = {"type": "http", "method": self.method, "path": self.path, "headers": [(b"content-type", b"application/json")],
                 "query_string": b""}
        sent = [{"type": "http.request", "body": REQUEST, "more_body": False}]
        out = {}

        async def receive():  # as uvicorn: the body, then nothing until the client leaves
            if sent:
                return sent.pop()
            await asyncio.Event().wait()

        async def send(message):
            if message["type"] == "http.response.start":
                out["status"], out["headers"] = message["status"], dict(message["headers"])
            else:
                out["body"] = message["body"]

        await self.gateway.handle(scope, receive, send)
        return out["status"], out["headers"], out["body"]


def make_gateway(**config) -> tuple[Gateway, list[str]]:
    pokes: list[str] = []
    gateway = Gateway(CollectorRegistry(), poke=pokes.append, known=lambda n: n == "f", config=GatewayConfig(**config))
    return gateway, pokes


def test_request_is_held_until_a_replica_is_ready():
    async def scenario():
        gateway, pokes = make_gateway()
        server, port, _ = await fake_replica()
        call = asyncio.ensure_future(Scope(gateway).call())
        await asyncio.sleep(0.05)
        assert not call.done() and gateway.held("f") == 1 and pokes == ["f"]
        gateway.add_endpoint("f", "r1", "127.0.0.1", port, spawn_s=0.03, load_s=0.01)
        status, headers, _ = await call
        server.close()
        return status, headers

    status, headers = asyncio.run(scenario())
    assert status == 200
    assert b"queue_wait=" in headers[b"shoal-cold-start"] and b"spawn=0.0300" in headers[b"shoal-cold-start"]


def test_held_request_times_out_with_504_and_queue_limit_gives_503():
    async def scenario():
        gateway, _ = make_gateway(hold_timeout_s=0.2, max_held_per_function=2)
        calls = [asyncio.ensure_future(Scope(gateway).call()) for _ in range(3)]
        return [c[0] for c in await asyncio.gather(*calls)]

    codes = asyncio.run(scenario())
    # two are held and time out (504); the third finds the queue of 2 full (503)
    assert sorted(codes) == [503, 504, 504]


def test_connection_refused_is_retried_on_another_replica(monkeypatch):
    import itertools

    # ties between equally loaded replicas break by random(); an increasing sequence
    # makes the first candidate (the dead one) win every first pick
    counter = itertools.count()
    monkeypatch.setattr("serving.gateway.random.random", lambda: next(counter))

    async def scenario():
        gateway, _ = make_gateway()
        server, port, served = await fake_replica()
        dead_port = port + 1 if port < 65000 else port - 1  # nothing listens there (checked below)
        try:
            await asyncio.open_connection("127.0.0.1", dead_port)
            pytest.skip("the neighbouring port is in use")
        except OSError:
            pass
        gateway.add_endpoint("f", "dead", "127.0.0.1", dead_port)
        gateway.add_endpoint("f", "alive", "127.0.0.1", port)
        results = [await Scope(gateway).call() for _ in range(6)]
        server.close()
        retries = gateway.metrics.retries.labels("f")._value.get()
        dead = next(e for e in gateway.routes["f"].endpoints if e.replica == "dead")
        return [r[0] for r in results], len(served), retries, dead.draining

    codes, served, retries, dead_draining = asyncio.run(scenario())
    assert codes == [200] * 6 and served == 6
    # the first request tried the dead replica, then the live one; after that the dead
    # one takes no more traffic (until the controller replaces it)
    assert retries == 1 and dead_draining


def test_drain_waits_for_in_flight_requests():
    async def scenario():
        gateway, _ = make_gateway()
        server, port, _ = await fake_replica(delay_s=0.3)
        gateway.add_endpoint("f", "r1", "127.0.0.1", port)
        call = asyncio.ensure_future(Scope(gateway).call())
        await asyncio.sleep(0.05)
        drained = await gateway.drain_endpoint("f", "r1", timeout_s=5)
        finished_first = call.done()
        status = (await call)[0]
        gateway.remove_endpoint("f", "r1")
        server.close()
        return drained, finished_first, status

    drained, finished_first, status = asyncio.run(scenario())
    assert drained and finished_first and status == 200


def test_replica_failure_answers_held_requests_at_once():
    async def scenario():
        gateway, _ = make_gateway(hold_timeout_s=30)
        call = asyncio.ensure_future(Scope(gateway).call())
        await asyncio.sleep(0.05)
        gateway.fail_waiters("f", "replica f-1 failed to start: not a loadable ONNX model")
        return await asyncio.wait_for(call, 5)

    status, headers, body = asyncio.run(scenario())
    assert status == 503 and b"not a loadable ONNX model" in body and headers[b"retry-after"] == b"5"


def test_held_request_whose_client_leaves_frees_its_slot():
    async def scenario():
        gateway, _ = make_gateway(hold_timeout_s=30)
        left = asyncio.Event()
        messages = [{"type": "http.request", "body": REQUEST, "more_body": False}]

        async def receive():
            if messages:
                return messages.pop(0)
            await left.wait()
            return {"type": "http.disconnect"}

        out = {}

        async def send(message):
            out.setdefault("status", message.get("status"))

        scope = {"type": "http", "method": "POST", "path": "/v2/models/f/infer", "headers": [], "query_string": b""}
        call = asyncio.ensure_future(gateway.handle(scope, receive, send))
        await asyncio.sleep(0.05)
        held_before = gateway.held("f")
        left.set()  # the client goes away while its request is held
        await asyncio.wait_for(call, 5)
        return held_before, gateway.held("f"), out["status"]

    held_before, held_after, status = asyncio.run(scenario())
    assert (held_before, held_after) == (1, 0)
    assert status == 499  # logged as such; the client is no longer there to read it


async def dropping_replica():
    """A replica that reads each request and then dies on it: closes the connection, no answer."""
    read = []

    async def handle(reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            read.append(1)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], read


def test_a_request_whose_replica_died_on_it_is_sent_once_more_to_another(monkeypatch):
    import itertools

    counter = itertools.count()  # ties break by random(): the first added replica wins the first pick
    monkeypatch.setattr("serving.gateway.random.random", lambda: next(counter))

    async def scenario():
        gateway, _ = make_gateway()
        dropper, drop_port, read = await dropping_replica()
        server, port, served = await fake_replica()
        gateway.add_endpoint("f", "dies", "127.0.0.1", drop_port)
        gateway.add_endpoint("f", "alive", "127.0.0.1", port)
        status = (await Scope(gateway).call())[0]
        dropper.close()
        server.close()
        return status, len(read), len(served), gateway.metrics.retries.labels("f")._value.get()

    status, read, served, retries = asyncio.run(scenario())
    # the first replica read the request and closed the connection; the second answered it
    assert (status, read, served, retries) == (200, 1, 1, 1)


def test_a_request_that_two_replicas_died_on_is_not_sent_to_a_third():
    async def scenario():
        gateway, _ = make_gateway()
        droppers = [await dropping_replica() for _ in range(3)]
        for i, (_, port, _) in enumerate(droppers):
            gateway.add_endpoint("f", f"r{i}", "127.0.0.1", port)
        status, _, body = await Scope(gateway).call()
        for server, _, _ in droppers:
            server.close()
        return status, body, sum(len(read) for _, _, read in droppers)

    status, body, reads = asyncio.run(scenario())
    # a request that kills replicas takes down two at most, never the whole function
    assert status == 502 and b"closed the connection" in body and reads == 2


def test_a_function_past_its_inflight_limit_gets_503_at_once_and_others_are_served():
    async def scenario():
        gateway = Gateway(CollectorRegistry(), poke=lambda n: None, known=lambda n: n in ("f", "g"),
                          config=GatewayConfig(max_inflight_per_function=3))
        slow, slow_port, _ = await fake_replica(delay_s=0.5)
        fast, fast_port, _ = await fake_replica()
        gateway.add_endpoint("f", "f-1", "127.0.0.1", slow_port)
        gateway.add_endpoint("g", "g-1", "127.0.0.1", fast_port)
        busy = [asyncio.ensure_future(Scope(gateway).call()) for _ in range(3)]
        await asyncio.sleep(0.1)  # three of f's requests are in the gateway
        start = asyncio.get_running_loop().time()
        over = await Scope(gateway).call()
        over_s = asyncio.get_running_loop().time() - start
        other = await Scope(gateway, "/v2/models/g/infer").call()
        done = [r[0] for r in await asyncio.gather(*busy)]
        slow.close()
        fast.close()
        return over, over_s, other[0], done

    (status, headers, body), over_s, other, done = asyncio.run(scenario())
    assert status == 503 and headers[b"retry-after"] == b"1" and b"limit 3" in body
    assert over_s < 0.25  # answered at once, not after f's slow requests
    assert other == 200 and done == [200, 200, 200]


async def dies_on_second_request():
    """Answers one request (so the gateway pools a connection to it), then reads the next,
    closes the connection and stops listening: a process killed by what it was sent."""
    died = []
    server_box = []

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                if b"/warm" not in head:
                    died.append(1)
                    server_box[0].close()  # new connections are refused from now on
                    break
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    server_box.append(server)
    return server, server.sockets[0].getsockname()[1], died


def test_over_pooled_connections_a_request_that_kills_replicas_takes_down_two_at_most():
    async def scenario():
        gateway, _ = make_gateway()
        replicas = [await dies_on_second_request() for _ in range(3)]
        for i, (_, port, _) in enumerate(replicas):
            gateway.add_endpoint("f", f"r{i}", "127.0.0.1", port)
        for endpoint in gateway.routes["f"].endpoints:  # a kept-alive connection to each
            assert (await endpoint.pool.request("POST", "/warm", [], b"{}", 5)).status == 200
        status, _, body = await Scope(gateway).call()
        for server, _, _ in replicas:
            server.close()
        return status, body, sum(len(died) for _, _, died in replicas)

    status, body, died = asyncio.run(scenario())
    assert status == 502 and b"closed the connection" in body and died == 2


def test_the_gateway_gives_up_at_the_functions_timeout_plus_its_margin():
    async def scenario():
        gateway = Gateway(CollectorRegistry(), poke=lambda n: None, known=lambda n: n == "f",
                          timeout_of=lambda n: 0.3)
        server, port, _ = await fake_replica(delay_s=30)  # never answers in time
        gateway.add_endpoint("f", "f-1", "127.0.0.1", port)
        start = asyncio.get_running_loop().time()
        status, _, body = await Scope(gateway).call()
        took = asyncio.get_running_loop().time() - start
        server.close()
        return status, body, took

    status, body, took = asyncio.run(scenario())
    # 0.3 s of the function's own timeout + 2 s margin (the replica's own 504 comes first when it can)
    assert status == 504 and b"no answer within 2.3 s" in body and 2.2 < took < 4, (status, body, took)


def test_in_flight_is_the_time_average_between_two_readings_not_a_count_at_one():
    """Knative's queue-proxy reports concurrency weighted by the time spent at each value
    (pkg/queue/stats.go); the gateway keeps the integral, so the controller's look reads the
    average since its last look. On a fake clock: two requests in flight together for 0.2 s
    of a 1 s span, then none, read 0.4, where a count at the span's end reads 0."""
    clock = [1000.0]

    async def scenario():
        gateway = Gateway(CollectorRegistry(), poke=lambda f: None, known=lambda n: n == "f", clock=lambda: clock[0])
        arrived: list[asyncio.StreamWriter] = []
        both = asyncio.Event()

        async def handle(reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            arrived.append(writer)
            if len(arrived) == 2:
                clock[0] += 0.2  # both inside the replica for 0.2 s
                both.set()
            await both.wait()
            body = b'{"ok": true}'
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(body), body))
            await writer.drain()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        gateway.add_endpoint("f", "r1", "127.0.0.1", server.sockets[0].getsockname()[1])
        before = gateway.inflight_seconds("f")
        codes = [c[0] for c in await asyncio.gather(Scope(gateway).call(), Scope(gateway).call())]
        clock[0] += 0.8  # the rest of the span, idle
        after = gateway.inflight_seconds("f")
        server.close()
        return codes, before, after, gateway.outstanding("f")

    codes, before, after, now = asyncio.run(scenario())
    assert codes == [200, 200]
    assert before == (0.0, 1000.0)
    assert after[1] == pytest.approx(1001.0)
    assert (after[0] - before[0]) / (after[1] - before[1]) == pytest.approx(0.4)
    assert now == 0
