"""The replica: one model on one slice, served over HTTP (V2 REST, KServe V1, /metrics).

    shoal replica ARTIFACT --name NAME [--port P] [--slice 1/4] [--device cpu|gpu:N|emulated:N]
    python -m serving.replica ARTIFACT --name NAME ...

The HTTP adapter is a plain ASGI app on uvicorn (httptools, uvloop): a thin
layer that reads bodies with a size limit, calls the DataPlane and maps its
exceptions to statuses with the table in serving/protocol/errors.py (written by
serving/asgi.py's `send_error`, as every Shoal server does). It binds
127.0.0.1 unless told otherwise, is live as soon as it listens, ready once the
model has loaded, and on SIGTERM stops accepting, finishes in-flight requests
and exits. A model call that meets a sticky CUDA error (the device lost: every
later call would fail) does the same, with status 4, so that it is replaced.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Awaitable, Callable

from functions.spec import LIMITS, BatchingSpec, ServingLimits, SliceRequest, SpecError, validate_name
from serving.asgi import JSON, read_body, send_error, send_response
from serving.executor import EmulatedCompute, SliceExecutor, apply_binding, bind_slice, parse_cpus
from serving.protocol.codec import (
    binary_output_names,
    decode_infer_request,
    dumps,
    encode_infer_response,
    parse_header_length,
    parse_json,
)
from serving.protocol.types import RawBody
from serving.protocol.errors import (
    InferenceError,
    InvalidInput,
    MethodNotAllowed,
    PayloadTooLarge,
    RouteNotFound,
    UnsupportedMediaType,
    message_of,
    status_of,
)

log = logging.getLogger("shoal.replica")

OCTET = b"application/octet-stream"
DEFAULT_MAX_BODY_BYTES = LIMITS.max_body_bytes
EXIT_LOAD_FAILED = 3
EXIT_DEVICE_LOST = 4  # a sticky CUDA error (serving.executor.device_lost): replace this replica

Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class ReplicaApp:
    """ASGI adapter over a DataPlane."""

    def __init__(self, dataplane, metrics, properties: dict[str, str], max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
        self.dataplane = dataplane
        self.metrics = metrics
        self.properties = properties
        self.max_body_bytes = max_body_bytes
        self.loader_task: asyncio.Task | None = None
        self.on_startup: list[Callable[[], Awaitable[None]]] = []
        self.on_shutdown: list[Callable[[], Awaitable[None]]] = []

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                for hook in self.on_startup:
                    await hook()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for hook in self.on_shutdown:
                    await hook()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ------------------------------------------------------------------ routing

    async def _http(self, scope: dict, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        try:
            if path.startswith("/v2/models/") and path.endswith("/infer"):
                return await self._infer(scope, receive, send, path)
            if path.startswith("/v1/models/") and path.endswith(":predict"):
                return await self._predict_v1(scope, receive, send, path)
            await self._get(method, path, send)
        except Exception as exc:  # never let a bug kill the connection without an answer
            if not isinstance(exc, InferenceError):
                log.exception("unhandled error on %s %s", method, path)
            await send_error(send, exc)

    async def _get(self, method: str, path: str, send: Send) -> None:
        route = _route_get(path)
        if route is None:
            raise RouteNotFound(f"no route for {path!r}")
        if method not in ("GET", "HEAD"):
            raise MethodNotAllowed(f"{method} is not allowed on {path}; use GET", allow="GET, HEAD")
        kind, name, version = route
        dp = self.dataplane
        if kind == "live":
            hung = dp.hung()
            return await _send_json(send, 503, {"live": False, "error": hung}) if hung else \
                await _send_json(send, 200, {"live": True})
        if kind == "ready":
            ready = dp.ready and dp.hung() is None  # a hung model takes no new requests
            return await _send_json(send, 200 if ready else 503, {"ready": ready})
        if kind == "server":
            return await _send_json(send, 200, dp.server_metadata())
        if kind == "metrics":
            return await self._metrics(send)
        if kind == "root":
            return await _send_json(send, 200, {"status": "alive"})
        if kind == "v1_list":
            return await _send_json(send, 200, {"models": [dp.model.name]})
        if kind in ("model_ready", "v1_model"):
            dp.check_model(name, version, need_ready=False)
            return await _send_json(send, 200 if dp.ready else 503, {"name": name, "ready": dp.ready})
        return await _send_json(send, 200, dp.model_metadata(name, version, self.properties))

    async def _metrics(self, send: Send) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        await send_response(send, 200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST.encode())

    # ------------------------------------------------------------------ inference

    async def _infer(self, scope: dict, receive: Receive, send: Send, path: str) -> None:
        parts = path[len("/v2/models/"):-len("/infer")].split("/")
        if len(parts) == 1:
            name, version = parts[0], None
        elif len(parts) == 3 and parts[1] == "versions":
            name, version = parts[0], parts[2]
        else:
            raise RouteNotFound(f"no route for {path!r}")
        await self._timed(send, self._infer_body(scope, receive, name, version))

    async def _infer_body(self, scope: dict, receive: Receive, name: str, version: str | None):
        if scope["method"] != "POST":
            raise MethodNotAllowed(f"{scope['method']} is not allowed on {scope['path']}; use POST", allow="POST")
        self.dataplane.check_model(name, version)
        self.dataplane.admit()
        headers = _headers(scope)
        body = await self._read_body(receive, headers)
        header_length = parse_header_length(headers.get("inference-header-content-length"), len(body))
        request = decode_infer_request(body, header_length)
        response = await self.dataplane.infer(name, version, request)
        binary = binary_output_names(request, [o.name for o in response.outputs])
        payload, json_length = encode_infer_response(response, binary)
        if json_length is None:
            return 200, payload, JSON, ()
        return 200, payload, OCTET, ((b"inference-header-content-length", str(json_length).encode()),)

    async def _predict_v1(self, scope: dict, receive: Receive, send: Send, path: str) -> None:
        name = path[len("/v1/models/"):-len(":predict")]
        await self._timed(send, self._predict_v1_body(scope, receive, name))

    async def _predict_v1_body(self, scope: dict, receive: Receive, name: str):
        if scope["method"] != "POST":
            raise MethodNotAllowed(f"{scope['method']} is not allowed on {scope['path']}; use POST", allow="POST")
        self.dataplane.check_model(name)
        self.dataplane.admit()
        headers = _headers(scope)
        body = parse_json(await self._read_body(receive, headers))
        result = await self.dataplane.predict_v1(name, body, headers)
        if isinstance(result, RawBody):
            extra = tuple((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in result.headers.items()
                          if k.lower() not in ("content-length", "content-type"))
            return result.status, result.body, result.content_type.encode("latin-1"), extra
        return 200, dumps(result), JSON, ()

    async def _timed(self, send: Send, work: Awaitable) -> None:
        """Run one inference request with the replica's request metrics around it."""
        m = self.metrics
        start = time.perf_counter()
        m.enter()
        try:
            status, payload, content_type, extra = await work
        except Exception as exc:
            status = status_of(exc)
            if status >= 500:
                log.warning("%s: %s", status, message_of(exc))
            await send_error(send, exc)
        else:
            await send_response(send, status, payload, content_type, extra)
        finally:
            m.leave()
        m.request_duration.observe(time.perf_counter() - start)
        m.count(status)

    async def _read_body(self, receive: Receive, headers: dict[str, str]) -> bytes:
        body = await read_body(receive, self.max_body_bytes, headers.get("content-length"))
        encoding = headers.get("content-encoding", "identity").lower()
        if encoding not in ("identity", ""):
            body = _decompress(body, encoding, self.max_body_bytes)
        return body


def _route_get(path: str) -> tuple[str, str | None, str | None] | None:
    """(kind, model name, version) for a GET route, or None."""
    fixed = {
        "/v2/health/live": "live", "/v2/health/ready": "ready", "/v2": "server", "/v2/": "server",
        "/metrics": "metrics", "/": "root", "/v1/models": "v1_list", "/v1/models/": "v1_list",
    }
    if path in fixed:
        return fixed[path], None, None
    if path.startswith("/v1/models/"):
        name = path[len("/v1/models/"):]
        return ("v1_model", name, None) if name and "/" not in name and ":" not in name else None
    if not path.startswith("/v2/models/"):
        return None
    parts = path[len("/v2/models/"):].split("/")
    ready = parts[-1] == "ready" and len(parts) in (2, 4)
    if ready:
        parts = parts[:-1]
    if len(parts) == 1 and parts[0]:
        name, version = parts[0], None
    elif len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        name, version = parts[0], parts[2]
    else:
        return None
    return ("model_ready" if ready else "model", name, version)


def _headers(scope: dict) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    if encoding not in ("gzip", "deflate"):
        raise UnsupportedMediaType(f"Content-Encoding {encoding!r} is not supported; use gzip, deflate or identity")
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(f"body is not valid {encoding}: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise PayloadTooLarge(f"decompressed body exceeds the limit of {limit} bytes")
    if not d.eof or d.unused_data:
        raise InvalidInput(f"body is not a complete {encoding} stream (truncated, or data after its end)")
    return out


async def _send_json(send: Send, status: int, doc: Any) -> None:
    await send_response(send, status, dumps(doc), JSON)


# ---------------------------------------------------------------------- process


def build_parser() -> argparse.ArgumentParser:
    batching = BatchingSpec()
    p = argparse.ArgumentParser(prog="shoal replica", description="Serve one model artifact on one slice.")
    p.add_argument("artifact", help="model file: .onnx, .pt, .joblib/.pkl, .py (handler or kserve.Model), .yaml profile")
    p.add_argument("--name", help="model name (default: the file name's stem)")
    p.add_argument("--version", default="1", help="model version (default 1)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (0 picks a free one; default 8080)")
    p.add_argument("--uds", help="also listen on this Unix socket (the local gateway's path: no TCP stack)")
    p.add_argument("--loader", help="override detection: onnx, torchscript, sklearn, handler, kserve, profile")
    p.add_argument("--trust", action="store_true", help="allow pickles (joblib/pickle), which run code when loaded")
    p.add_argument("--slice", default="1/4", help="share of the device: '1/4', or '1/4:2048' with a memory budget in MiB")
    p.add_argument("--profile-slice",
                   help="an emulated profile's: the slice its latencies hold on, the function's deployed one "
                        "(default: --slice); on another --slice they run in proportion (1/4 on 1/8: twice "
                        "as long; on 1/2: half). Other models ignore it")
    p.add_argument("--device", default="auto", help="cpu, gpu:N or emulated:N (auto: gpu:0 when a GPU is visible)")
    p.add_argument("--cpus", help="CPU affinity, e.g. '0-1' (default: not pinned)")
    p.add_argument("--max-batch-size", type=int, default=batching.max_batch_size)
    p.add_argument("--max-queue-delay-ms", type=float, default=batching.max_queue_delay_ms)
    p.add_argument("--preferred-batch-sizes", default="", help="comma-separated, e.g. '4,8'")
    p.add_argument("--max-queue", type=int, default=batching.max_queue_requests, help="requests waiting before 503")
    p.add_argument("--max-body-mib", type=float, default=DEFAULT_MAX_BODY_BYTES / 2**20)
    p.add_argument("--request-timeout-s", type=float, default=LIMITS.request_timeout_s)
    p.add_argument("--log-level", default="warning")
    return p


def default_device() -> str:
    """gpu:0 when an NVIDIA device node exists and CUDA_VISIBLE_DEVICES does not hide it."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1")
    return "gpu:0" if Path("/dev/nvidia0").exists() and not hidden else "cpu"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        name = validate_name(args.name or _name_from(args.artifact), "model name")
        slice_request = SliceRequest.parse(args.slice)
        batching = BatchingSpec(
            max_batch_size=args.max_batch_size,
            max_queue_delay_ms=args.max_queue_delay_ms,
            preferred_batch_sizes=_sizes(args.preferred_batch_sizes),
            max_queue_requests=args.max_queue,
        )
        ServingLimits(int(args.max_body_mib * 2**20), args.request_timeout_s)  # validates both
        device = default_device() if args.device == "auto" else args.device
        binding = bind_slice(slice_request, device, parse_cpus(args.cpus), usable_cpus())
        measured_on = SliceRequest.parse(args.profile_slice) if args.profile_slice else slice_request
    except (SpecError, ValueError) as exc:
        print(f"shoal replica: {exc}", file=sys.stderr)
        return 2
    apply_binding(binding)  # before any framework starts threads
    return _serve(args, name, binding, batching, float(measured_on.fraction / slice_request.fraction))


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpecError(f"--preferred-batch-sizes {text!r} must be integers separated by commas, e.g. 4,8") from None


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask), not all the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _name_from(artifact: str) -> str:
    stem = Path(artifact).stem.lower().replace("_", "-").replace(".", "-")
    return "".join(c for c in stem if c.isalnum() or c == "-").strip("-") or "model"


def _serve(args, name: str, binding, batching: BatchingSpec, slowdown: float) -> int:
    from serving.dataplane import DataPlane
    from serving.metrics import ReplicaMetrics
    from serving.models import LoadError, LoadOptions, create_model

    options = LoadOptions(
        threads=binding.threads, device=binding.device, gpu_mem_limit_mib=binding.slice.memory_mib,
        trust=args.trust, version=args.version, slowdown=slowdown,
    )
    try:
        model = create_model(args.artifact, name, args.loader, options)
    except LoadError as exc:
        print(f"shoal replica: {exc}", file=sys.stderr)
        return 2
    metrics = ReplicaMetrics(name, binding.labels())
    executor = SliceExecutor(binding, EmulatedCompute.from_env(binding))
    metrics.track_busy(executor.busy_seconds)
    dataplane = DataPlane(model, executor, metrics, batching, request_timeout_s=args.request_timeout_s)
    app = ReplicaApp(dataplane, metrics, binding.labels(), int(args.max_body_mib * 2**20))
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        print(f"shoal replica: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    sockets = [sock]
    if args.uds:
        try:
            sockets.append(_bind_unix(args.uds))
        except OSError as exc:
            print(f"shoal replica: cannot listen on {args.uds}: {exc}", file=sys.stderr)
            return 2
    host, port = sock.getsockname()[:2]
    label = " (emulated device)" if binding.emulated else ""
    print(f"shoal replica {name} listening on http://{host}:{port} slice {binding.slice.name} on {binding.device}{label}", flush=True)
    return _run_server(app, dataplane, executor, sockets, args.log_level, LoadError)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _bind_unix(path: str) -> socket.socket:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(2048)
    return sock


def _run_server(app: ReplicaApp, dataplane, executor: SliceExecutor, sockets, log_level: str, load_error_type) -> int:
    import uvicorn

    config = uvicorn.Config(
        app, loop="none", http="httptools", ws="none", lifespan="on", log_level=log_level, access_log=False,
        server_header=False, date_header=False, timeout_graceful_shutdown=int(LIMITS.graceful_shutdown_s), backlog=2048,
        proxy_headers=False,
    )
    server = uvicorn.Server(config)
    exit_code = 0

    async def load_model() -> None:
        nonlocal exit_code
        try:
            await dataplane.load()
        except load_error_type as exc:
            print(f"shoal replica: {exc}", file=sys.stderr, flush=True)
            exit_code, server.should_exit = EXIT_LOAD_FAILED, True
        except Exception as exc:
            print(f"shoal replica: loading the model failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            exit_code, server.should_exit = EXIT_LOAD_FAILED, True

    async def startup() -> None:
        app.loader_task = asyncio.get_running_loop().create_task(load_model())

    def device_lost(why: str) -> None:
        # every later call would fail: drain (the requests queued fail as fast) and exit to be
        # replaced; under MPS the GPU's server takes no new client until its clients have exited
        nonlocal exit_code
        print(f"shoal replica: the device was lost ({why}); exiting to be replaced", file=sys.stderr, flush=True)
        exit_code, server.should_exit = EXIT_DEVICE_LOST, True

    dataplane.on_lost = device_lost

    app.on_startup.append(startup)
    app.on_shutdown.append(dataplane.stop)
    # uvicorn drains on SIGTERM/SIGINT, then re-raises the signal with the handler
    # it found; a no-op one lets a drained replica exit with status 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(server.serve(sockets=sockets))
    for extra in sockets[1:]:
        try:
            os.unlink(extra.getsockname())
        except OSError:
            pass
    if executor.running:
        # A model call is stuck (a hung model, a load still going): the thread cannot be
        # interrupted, and interpreter exit would join it forever. Leave without it.
        print("shoal replica: a model call is still running; exiting without it", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(exit_code)
    executor.shutdown()
    return exit_code


def event_loop_factory():
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


if __name__ == "__main__":
    sys.exit(main())
