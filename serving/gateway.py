"""The gateway: the front door for every function, and the activator that holds requests while
a function scales from zero. It routes to ready replicas (least outstanding requests), holds
requests in a bounded queue per function while none is ready (503 when full, 504 past the hold
timeout, never a silent drop), measures cold starts by phase and each function's latency from
arrival (held time included: what the controller's p95 and error budget read), retries a request
a dead replica never answered, and caps each function's share of the gateway. It knows nothing of the
controller: it is driven through `add_endpoint` / `drain_endpoint` / `remove_endpoint` and asks
for capacity through its `poke` callback. How each of these behaves: docs/design/gateway.md.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from autoscaler.metrics import cumulative_histogram
from functions.spec import LIMITS
from serving.asgi import read_body, send_error, send_response
from serving.metrics import LATENCY_BUCKETS_S, InFlight
from serving.protocol.errors import (
    BadGateway,
    ClientDisconnected,
    InferenceError,
    InferenceTimeout,
    InvalidInput,
    ModelNotFound,
    Overloaded,
    RouteNotFound,
    Unavailable,
)
from serving.upstream import HOP_BY_HOP, UpstreamPool, UpstreamUnavailable

log = logging.getLogger("shoal.gateway")

COLD_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    max_held_per_function: int = 256
    max_held_bytes_per_function: int = 256 * 1024 * 1024
    hold_timeout_s: float = 30.0
    request_timeout_s: float = LIMITS.request_timeout_s
    max_body_bytes: int = LIMITS.max_body_bytes
    max_retries: int = 2
    max_inflight_per_function: int = 2048


@dataclass(frozen=True, slots=True)
class ColdStart:
    """How a replica came up, as measured by whoever started it."""

    spawn_s: float
    load_s: float


@dataclass(eq=False)
class Endpoint:
    replica: str
    pool: UpstreamPool
    cold: ColdStart | None = None
    outstanding: int = 0
    draining: bool = False
    first_done: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class Route:
    function: str
    endpoints: list[Endpoint] = field(default_factory=list)
    waiters: collections.deque = field(default_factory=collections.deque)
    metadata: dict[str, bytes] = field(default_factory=dict)  # cached model metadata, by path
    held_bytes: int = 0
    inflight: int = 0  # requests inside the gateway, held or sent
    # sent to a replica, not yet answered; one removed with its endpoint counts here until
    # answered, where outstanding() no longer sees it
    sent: InFlight = field(default_factory=InFlight)

    def ready(self) -> list[Endpoint]:
        return [e for e in self.endpoints if not e.draining]


REFUSED_S = 2 * LATENCY_BUCKETS_S[-1]  # a refused request in the latency histogram: over every bound (60 s)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry):
        r = registry
        self.requests = Counter("shoal_gateway_requests", "Requests answered by the gateway",
                                ["function", "code"], registry=r)
        # latency as the user sees it: from arrival at the gateway to the answer, time held through a
        # cold start included; inference requests only (a metadata GET answered from the cache would
        # dilute it). The SLO alerts and the controller's p95 and error budget read it
        self.duration = Histogram("shoal_gateway_request_duration_seconds",
                                  "Inference requests, from arrival at the gateway to the answer (held time included)",
                                  ["function"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.queue = Gauge("shoal_activator_queue_depth", "Requests held waiting for a replica",
                           ["function"], registry=r)
        self.cold = Histogram("shoal_cold_start_seconds", "Cold start time by phase",
                              ["function", "phase"], buckets=COLD_BUCKETS_S, registry=r)
        self.retries = Counter("shoal_gateway_retries", "Requests sent again to another replica",
                               ["function"], registry=r)
        self._children: dict[tuple[str, int], tuple] = {}

    def count(self, function: str, status: int, seconds: float, inference: bool = True) -> None:
        """One answered request (label lookups cached: this runs on every request). An inference
        request goes into the latency histogram the controller reads p95 and the share over the
        SLO from: answered, its time; refused by the platform (5xx: no slice, overloaded, timed
        out), as REFUSED_S, past every finite bound, since it never met its SLO (a 503 answered
        in a millisecond must not read as a fast success); a client's error (4xx) not at all."""
        children = self._children.get((function, status))
        if children is None:
            children = self._children[(function, status)] = (
                self.requests.labels(function, str(status)), self.duration.labels(function))
        children[0].inc()
        if inference and status < 400:
            children[1].observe(seconds)
        elif inference and status >= 500:
            children[1].observe(max(seconds, REFUSED_S))

    def latencies(self) -> dict[str, tuple[tuple[float, float], ...]]:
        """Each function's cumulative latency histogram so far, ((le, requests), ..., (inf, all)),
        as metrics.quantile and fraction_over read it: shoal up's controller reads it in process."""
        pairs: dict[str, list[tuple[float, float]]] = {}
        for family in self.duration.collect():
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    pairs.setdefault(sample.labels["function"], []).append((float(sample.labels["le"]), sample.value))
        return {function: cumulative_histogram(p) for function, p in pairs.items()}


class Gateway:
    def __init__(
        self,
        registry: CollectorRegistry,
        poke: Callable[[str], None],
        known: Callable[[str], bool],
        config: GatewayConfig = GatewayConfig(),
        authorize: Callable[[dict[bytes, bytes]], InferenceError | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        timeout_of: Callable[[str], float] | None = None,
    ):
        self.config = config
        self._timeout_of = timeout_of
        self.metrics = GatewayMetrics(registry)
        self._poke = poke
        self._known = known
        self._authorize = authorize
        self._clock = clock
        self.routes: dict[str, Route] = {}

    # ------------------------------------------------------------------ control side

    def route(self, function: str) -> Route:
        route = self.routes.get(function)
        if route is None:
            route = self.routes[function] = Route(function)
            self.metrics.queue.labels(function).set_function(lambda r=route: len(r.waiters))
        return route

    def add_endpoint(self, function: str, replica: str, host: str, port: int,
                     spawn_s: float | None = None, load_s: float | None = None, uds: str | None = None) -> None:
        """A replica is ready: route to it and wake the requests held for it.
        spawn_s/load_s: how long it took to start and load, when it was a cold start."""
        route = self.route(function)
        cold = ColdStart(spawn_s, load_s) if spawn_s is not None and load_s is not None else None
        if not route.waiters:
            cold = None  # a scale-out nobody waited for is not a cold start
        endpoint = Endpoint(replica, UpstreamPool(host, port, uds=uds), cold)
        endpoint.idle.set()
        route.endpoints.append(endpoint)
        if cold is not None:
            self.metrics.cold.labels(function, "spawn").observe(cold.spawn_s)
            self.metrics.cold.labels(function, "load").observe(cold.load_s)
        while route.waiters:  # wake every held request; each picks the least loaded replica
            waiter = route.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def drain_endpoint(self, function: str, replica: str, timeout_s: float) -> bool:
        """Stop sending to a replica and wait until its in-flight requests are answered."""
        endpoint = self._find(function, replica)
        if endpoint is None:
            return True
        endpoint.draining = True
        try:
            await asyncio.wait_for(endpoint.idle.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    def remove_endpoint(self, function: str, replica: str) -> None:
        route = self.routes.get(function)
        endpoint = self._find(function, replica)
        if route is not None and endpoint is not None:
            route.endpoints.remove(endpoint)
            endpoint.pool.close()

    def forget(self, function: str) -> None:
        """The function was removed: answer its held requests with 404."""
        route = self.routes.pop(function, None)
        if route is None:
            return
        for endpoint in route.endpoints:
            endpoint.pool.close()
        while route.waiters:
            waiter = route.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ModelNotFound(function))
        self.metrics.queue.remove(function)

    def invalidate(self, function: str) -> None:
        """The function changed (a new revision): forget what was cached about it."""
        route = self.routes.get(function)
        if route is not None:
            route.metadata.clear()

    def fail_waiters(self, function: str, message: str) -> None:
        """A replica could not start: answer the held requests now (503) instead of
        letting them wait out the hold timeout."""
        route = self.routes.get(function)
        while route is not None and route.waiters:
            waiter = route.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(Unavailable(message))

    def metadata(self, function: str) -> bytes | None:
        """The model metadata a replica of the function's revision answered through here, if any."""
        route = self.routes.get(function)
        return route.metadata.get(f"/v2/models/{function}") if route else None

    def latencies(self) -> dict[str, tuple[tuple[float, float], ...]]:
        """Each function's latency from arrival here, cumulative (GatewayMetrics.latencies)."""
        return self.metrics.latencies()

    def held(self, function: str) -> int:
        route = self.routes.get(function)
        return len(route.waiters) if route else 0

    def outstanding(self, function: str) -> int:
        route = self.routes.get(function)
        return sum(e.outstanding for e in route.endpoints) if route else 0

    def inflight_seconds(self, function: str) -> tuple[float, float]:
        """(request-seconds its requests have spent sent to a replica and unanswered, the
        gateway's clock now): two readings give the time-averaged in-flight between them (InFlight)."""
        now = self._clock()
        route = self.routes.get(function)
        return (route.sent.area(now) if route else 0.0), now

    def _find(self, function: str, replica: str) -> Endpoint | None:
        route = self.routes.get(function)
        return next((e for e in route.endpoints if e.replica == replica), None) if route else None

    # ------------------------------------------------------------------ data side

    def denied(self, headers: dict[bytes, bytes]) -> InferenceError | None:
        """The error to answer when inference needs a token and this request lacks it."""
        return None if self._authorize is None else self._authorize(headers)

    async def handle(self, scope: dict, receive, send) -> None:
        """ASGI entry for inference paths: /v2/models/... and /v1/models/..."""
        start = self._clock()
        function = _function_of(scope["path"])
        label = "-"  # metrics label: the function, once it is known to exist
        try:
            if function is None:
                raise RouteNotFound(f"no route for {scope['path']!r}")
            headers = dict(scope["headers"])
            if (denied := self.denied(headers)) is not None:
                raise denied
            if not self._known(function):
                raise ModelNotFound(function)
            label = function
            status, out_headers, body = await self._dispatch(scope, receive, function, headers, start)
        except Exception as exc:
            if not isinstance(exc, InferenceError):
                log.exception("gateway error on %s", scope["path"])
            status = await send_error(send, exc)
        else:
            await send_response(send, status, body, None, out_headers)  # the replica's own Content-Type
        self.metrics.count(label, status, self._clock() - start, inference=scope["method"] == "POST")

    async def _dispatch(self, scope, receive, function, headers, start):
        method = scope["method"]
        path = _raw_target(scope)
        route = self.route(function)
        if method == "GET" and path in route.metadata:
            return 200, [(b"content-type", b"application/json")], route.metadata[path]
        if route.inflight >= self.config.max_inflight_per_function:
            raise Overloaded(f"function {function!r} has {route.inflight} requests in the gateway "
                             f"(limit {self.config.max_inflight_per_function}); retry later")
        route.inflight += 1
        try:
            return await self._forward(scope, receive, route, method, path, headers, start)
        finally:
            route.inflight -= 1

    async def _forward(self, scope, receive, route, method, path, headers, start):
        function = route.function
        body = await read_body(receive, self.config.max_body_bytes, _header(headers, b"content-length"))
        forward = [(k, v) for k, v in headers.items() if k not in HOP_BY_HOP and k != b"authorization"]
        deadline = start + self.config.hold_timeout_s
        timeout_s = self.config.request_timeout_s
        if self._timeout_of is not None:  # the replica answers 504 at the function's timeout; this is the backstop
            timeout_s = self._timeout_of(function) + 2.0
        tried: set[str] = set()
        waited = 0.0
        resent = False
        for attempt in range(self.config.max_retries + 1):
            endpoint, held_s = await self._pick(route, deadline, exclude=tried, size=len(body), receive=receive)
            waited += held_s
            sent_at = self._clock()
            try:
                response = await self._send(route, endpoint, method, path, forward, body, timeout_s)
            except UpstreamUnavailable as exc:
                tried.add(endpoint.replica)
                if exc.retryable:
                    # nothing answers there: route around it and let the controller replace it
                    endpoint.draining = True
                    self._poke(function)
                # dropped without an answer: the replica died, maybe of this request; once more elsewhere
                again = exc.retryable or (exc.dropped and not resent)
                resent = resent or exc.dropped
                if not again or attempt == self.config.max_retries:
                    raise BadGateway(f"replica {endpoint.replica} failed: {exc}") from None
                self.metrics.retries.labels(function).inc()
                continue
            out = [(k, v) for k, v in response.headers if k not in HOP_BY_HOP]
            if waited > 0:
                service_s = self._clock() - sent_at
                out.append((b"shoal-cold-start", self._observe_cold(function, endpoint, waited, service_s).encode()))
            if method == "GET" and response.status == 200 and path == f"/v2/models/{function}":
                route.metadata[path] = response.body  # model metadata: answerable while scaled to zero
            return response.status, out, response.body
        raise AssertionError("unreachable")

    async def _pick(self, route: Route, deadline: float, exclude: set[str], size: int = 0,
                    receive=None) -> tuple[Endpoint, float]:
        """The least loaded ready replica, waiting for one (bounded) when there is none.
        A held request whose client goes away leaves the queue at once."""
        held_at = None
        while True:
            candidates = [e for e in route.ready() if e.replica not in exclude]
            if candidates:
                waited = 0.0 if held_at is None else self._clock() - held_at
                return min(candidates, key=lambda e: (e.outstanding, random.random())), waited
            self._check_room(route, size)
            if held_at is None:
                held_at = self._clock()
            waiter = asyncio.get_running_loop().create_future()
            route.waiters.append(waiter)
            route.held_bytes += size
            self._poke(route.function)
            try:
                await self._wait_held(route.function, waiter, receive, deadline)
            finally:
                route.held_bytes -= size
                if waiter in route.waiters:
                    route.waiters.remove(waiter)

    async def _wait_held(self, function: str, waiter: asyncio.Future, receive, deadline: float) -> None:
        """Wait for a replica, the deadline, or the client leaving (its body is read, so the
        next ASGI message can only be the disconnect), whichever comes first."""
        gone = asyncio.ensure_future(receive()) if receive is not None else None
        try:
            while not waiter.done():
                pending = {waiter} if gone is None or gone.done() else {waiter, gone}
                remaining = max(0.0, deadline - self._clock())
                done, _ = await asyncio.wait(pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    raise InferenceTimeout(
                        f"no replica of {function!r} became ready within {self.config.hold_timeout_s:g} s")
                if gone in done and gone.exception() is None and gone.result().get("type") == "http.disconnect":
                    raise ClientDisconnected(f"client left while waiting for a replica of {function!r}")
            waiter.result()  # a replica that failed to start is raised here
        finally:
            if gone is not None:
                gone.cancel()

    def _check_room(self, route: Route, size: int) -> None:
        """Held requests are bounded in count and in bytes, per function."""
        if len(route.waiters) >= self.config.max_held_per_function:
            raise Overloaded(
                f"function {route.function!r} has {len(route.waiters)} requests waiting for a replica "
                f"(limit {self.config.max_held_per_function}); retry later"
            )
        if route.held_bytes + size > self.config.max_held_bytes_per_function:
            raise Overloaded(
                f"function {route.function!r} holds {route.held_bytes} bytes of waiting requests "
                f"(limit {self.config.max_held_bytes_per_function}); retry later"
            )

    async def _send(self, route: Route, endpoint: Endpoint, method, path, headers, body, timeout_s: float):
        endpoint.outstanding += 1
        route.sent.change(+1, self._clock())
        endpoint.idle.clear()
        try:
            return await endpoint.pool.request(method, path, headers, body, timeout_s)
        except asyncio.TimeoutError:
            raise InferenceTimeout(f"replica {endpoint.replica} gave no answer within {timeout_s:g} s") from None
        finally:
            endpoint.outstanding -= 1
            route.sent.change(-1, self._clock())
            if endpoint.outstanding == 0:
                endpoint.idle.set()

    def _observe_cold(self, function: str, endpoint: Endpoint, waited: float, service_s: float) -> str:
        """Record the phases of a cold start this request waited for; the header value."""
        m = self.metrics.cold
        m.labels(function, "queue_wait").observe(waited)  # per request that waited
        parts = [f"queue_wait={waited:.4f}"]
        if endpoint.cold is not None:
            parts += [f"spawn={endpoint.cold.spawn_s:.4f}", f"load={endpoint.cold.load_s:.4f}"]
        if not endpoint.first_done:
            endpoint.first_done = True
            m.labels(function, "first_inference").observe(service_s)
            parts.append(f"first_inference={service_s:.4f}")
        return ", ".join(parts)


def _header(headers: dict[bytes, bytes], name: bytes) -> str | None:
    value = headers.get(name)
    return value.decode("latin-1") if value is not None else None


def _raw_target(scope: dict) -> str:
    """The request target as the client sent it (still percent-encoded), so a decoded
    CR, LF or space can never reach the request line sent to a replica."""
    raw = scope.get("raw_path") or scope["path"].encode("utf-8")
    query = scope.get("query_string") or b""
    target = raw + (b"?" + query if query else b"")
    if any(b <= 0x20 or b == 0x7F for b in target):
        raise InvalidInput("request target contains control characters or spaces")
    return target.decode("latin-1")


def _function_of(path: str) -> str | None:
    for prefix in ("/v2/models/", "/v1/models/"):
        if path.startswith(prefix):
            rest = path[len(prefix):]
            name = rest.split("/", 1)[0].split(":", 1)[0]
            return name or None
    return None
