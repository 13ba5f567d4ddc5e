"""The zygote (`python -m deploy.local.zygote`, started by the local backend): imports the replica
runtime once, then forks a replica per request, which starts with the runtime already imported.
Forking needs a single-threaded parent, so it starts no thread pools (OPENBLAS/OMP threads are
set to 1 before numpy loads). PR_SET_PDEATHSIG ties the zygote to the control plane and each
replica to the zygote, so a `kill -9` of the control plane leaves no orphan. One JSON object a
line: on stdin `{"op": "spawn", "id": ..., "argv": [...], "env": {...}, "log": PATH}` or
`{"op": "signal", "pid": N, "signal": 15}`; on stdout `{"op": "spawned", "id": ..., "pid": N}`
and, when a replica exits, `{"op": "exited", "pid": N, "code": C}`.
"""

from __future__ import annotations

import ctypes
import json
import os
import selectors
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: deliver `sig` to this process when its parent exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: best effort only
        pass


def preload() -> None:
    """Import what every replica needs, once (numpy, onnxruntime, uvicorn, metrics)."""
    for key in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(key, "1")
    import numpy  # noqa: F401
    import uvicorn  # noqa: F401
    import prometheus_client  # noqa: F401

    import serving.dataplane  # noqa: F401
    import serving.replica  # noqa: F401
    import serving.models.onnx  # noqa: F401
    import serving.models.profile  # noqa: F401

    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        pass


def _send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _child(command: dict, parent: int) -> None:
    """In the forked replica: detach from the zygote's pipes, then run the replica.
    Whatever happens, this never returns into the zygote's loop."""
    code = 1
    try:
        die_with_parent()
        if os.getppid() != parent:  # the zygote died between fork and prctl
            os._exit(1)
        os.setsid()  # its own session: a terminal's Ctrl-C is for shoal up, which drains first
        log = os.open(command.get("log", os.devnull), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.environ.update(command.get("env", {}))
        from serving.replica import main

        code = main(command["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # report, never return into the zygote's loop
        try:
            print(f"replica crashed: {type(exc).__name__}: {exc}", file=sys.stderr)
        except Exception:
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        CHILDREN.discard(pid)
        _send({"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


def _commands(buffer: bytearray):
    """Complete JSON lines from the bytes read so far (the rest stays buffered)."""
    while (end := buffer.find(b"\n")) >= 0:
        line = bytes(buffer[:end])
        del buffer[: end + 1]
        if line.strip():
            yield json.loads(line)


CHILDREN: set[int] = set()


def _handle(command: dict, me: int) -> None:
    if command["op"] == "spawn":
        pid = os.fork()
        if pid == 0:
            _child(command, me)
        CHILDREN.add(pid)
        _send({"op": "spawned", "id": command["id"], "pid": pid})
    elif command["op"] == "signal":
        pid = int(command["pid"])
        if pid not in CHILDREN:  # only its own replicas: never 0, -1 or a stranger
            return
        try:
            os.kill(pid, int(command["signal"]))
        except ProcessLookupError:
            pass


def serve() -> None:
    """Read commands from stdin with os.read, not a buffered readline: two commands that
    arrive together must both run now, not wait for the next byte on stdin."""
    me = os.getpid()
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    buffer = bytearray()
    _send({"op": "hello", "pid": me})
    while True:
        for _ in selector.select(timeout=0.05):
            data = os.read(0, 65536)
            if not data:  # the control plane closed our stdin: it is gone, so are we
                return    # (and our replicas, by their PR_SET_PDEATHSIG)
            buffer += data
            for command in _commands(buffer):
                _handle(command, me)
        _reap()


def main() -> None:
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # shoal up decides when replicas stop
    die_with_parent()
    if os.getppid() != parent:  # the control plane died before prctl took hold
        sys.exit(1)
    preload()
    serve()


if __name__ == "__main__":
    main()
