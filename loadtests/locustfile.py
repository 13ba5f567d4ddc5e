"""Locust users for Shoal's V2 endpoints, following one of loadtests/scenarios.py's schedules:
open loop by default (one `ArrivalUser` sends each request at its scheduled time, so overload
shows as latency and errors, and a request not sent or never answered is recorded as a failure,
never dropped), or closed loop with `--shoal-users U`. `shoal loadtest` runs this file in a
Locust process of its own; it also runs with the plain `locust` CLI. Options and the request
log: docs/loadtests.md.

    locust -f loadtests/locustfile.py --headless --host http://127.0.0.1:8080 \\
        --shoal-function digits --shoal-scenario spike --shoal-rate 40 --shoal-duration 60
"""

from __future__ import annotations

import csv
import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gevent
import gevent.pool
import numpy as np
from locust import FastHttpUser, LoadTestShape, constant, events, task
from locust.exception import StopUser

from loadtests.scenarios import SCENARIOS, Schedule, make_schedule
from loadtests.tensors import ENCODINGS, Body, body_for

# Locust writes its CSVs once a second and not again at exit: a quiet end this long lets the last write
# include every request (../shared/PACKAGES.md).
CSV_SETTLE_S = 2.5
LOG_FIELDS = ("start", "scheduled", "latency_ms", "status", "function", "error", "cold_start")


@dataclass
class Plan:
    schedule: Schedule
    bodies: dict[str, Body]
    auth: dict[str, str]
    users: int
    max_inflight: int
    drain_s: float
    timeout_s: float
    done: bool = False


PLAN: Plan | None = None
_LOG: Any = None
_WRITER: Any = None
_START_FILE: Path | None = None


@events.init_command_line_parser.add_listener
def _arguments(parser) -> None:
    g = parser  # Locust's own parser: an argument group would not take include_in_web_ui / is_secret
    g.add_argument("--shoal-function", default="digits", help="function name(s), comma-separated (longtail: several)")
    g.add_argument("--shoal-scenario", default="steady", choices=SCENARIOS)
    g.add_argument("--shoal-rate", type=float, default=20.0, help="peak offered requests per second")
    g.add_argument("--shoal-duration", type=float, default=60.0, help="seconds of arrivals")
    g.add_argument("--shoal-seed", type=int, default=0)
    g.add_argument("--shoal-users", type=int, default=0, help="closed loop with at most this many users (0: open loop)")
    g.add_argument("--shoal-encoding", default="json", choices=ENCODINGS)
    g.add_argument("--shoal-batch", type=int, default=1, help="rows per request (for -1 dimensions)")
    g.add_argument("--shoal-inputs", default="", help="JSON file {function: V2 model metadata}")
    g.add_argument("--shoal-token", default="", is_secret=True, env_var="LOCUST_SHOAL_TOKEN",
                   help="bearer token (shoal up --auth-inference); better from the environment than argv")
    g.add_argument("--shoal-log", default="", help="write one CSV row per request here")
    g.add_argument("--shoal-max-inflight", type=int, default=1000)
    g.add_argument("--shoal-drain-s", type=float, default=30.0,
                   help="wait this long for answers after the last arrival")
    g.add_argument("--shoal-timeout-s", type=float, default=60.0, help="client timeout per request")
    g.add_argument("--shoal-options", default="{}",
                   help="JSON of scenario options (base_rate, spike_s, cv, idle_s, ...)")


@events.init.add_listener
def _plan(environment, **_kw) -> None:
    global PLAN, _LOG, _WRITER, _START_FILE
    o = environment.parsed_options
    if o is None or environment.host is None:
        return
    functions = [f.strip() for f in o.shoal_function.split(",") if f.strip()]
    schedule = make_schedule(o.shoal_scenario, functions=functions, duration_s=o.shoal_duration, rate=o.shoal_rate,
                             seed=o.shoal_seed, **json.loads(o.shoal_options))
    auth = {"authorization": f"Bearer {o.shoal_token}"} if o.shoal_token else {}
    metadata = json.load(open(o.shoal_inputs)) if o.shoal_inputs else {}
    bodies = {}
    for name in schedule.functions:
        meta = metadata.get(name) or _metadata(environment.host, name, auth)
        bodies[name] = body_for(meta, encoding=o.shoal_encoding, batch=o.shoal_batch, seed=o.shoal_seed)
    PLAN = Plan(schedule, bodies, auth, o.shoal_users, o.shoal_max_inflight, o.shoal_drain_s, o.shoal_timeout_s)
    for cls in (ArrivalUser, InferenceUser):
        cls.network_timeout = cls.connection_timeout = o.shoal_timeout_s
    ArrivalUser.concurrency = max(10, o.shoal_max_inflight)
    if o.shoal_log:
        _LOG = open(o.shoal_log, "w", newline="", buffering=1)
        _WRITER = csv.writer(_LOG)
        _WRITER.writerow(LOG_FIELDS)
        _START_FILE = Path(o.shoal_log).with_suffix(".t0")


def _mark_start(t: float) -> None:
    """When the schedule's second 0 was: the report's time axis starts there."""
    if _START_FILE is not None:
        _START_FILE.write_text(f"{t:.6f}")


@events.test_start.add_listener
def _closed_loop_start(**_kw) -> None:
    if PLAN is not None and PLAN.users > 0:
        _mark_start(time.time())


def _metadata(host: str, name: str, auth: dict[str, str]) -> dict[str, Any]:
    request = urllib.request.Request(f"{host.rstrip('/')}/v2/models/{name}", headers=auth)
    with urllib.request.urlopen(request, timeout=120) as r:  # a function at zero starts a replica for this
        return json.load(r)


@events.request.add_listener
def _log(request_type, name, response_time, response_length, response=None, context=None, exception=None,
         start_time=None, **_kw) -> None:
    if _WRITER is None:
        return
    context = context or {}
    status = getattr(response, "status_code", None) or 0
    cold = ""
    if response is not None and status:
        cold = response.headers.get("shoal-cold-start") or ""
    error = "" if exception is None else str(exception).replace("\n", " ")[:200]
    if response is not None and status >= 400:  # the server's own reason ("cannot place a replica ...")
        error = f"{status}: {_server_reason(response)}" if _server_reason(response) else error
    _WRITER.writerow((f"{start_time or time.time():.6f}", context.get('scheduled', ''),
                      f"{response_time:.3f}", status, context.get("function", name), error, cold))


def _server_reason(response) -> str:
    """The `error` of a JSON error body (V2's form), or "" when there is none."""
    try:
        return str(json.loads(response.text or "{}").get("error", "")).replace("\n", " ")[:300]
    except (ValueError, AttributeError):
        return ""


@events.quitting.add_listener
def _close(**_kw) -> None:
    if _LOG is not None:
        _LOG.flush()
        _LOG.close()


def _send(user: FastHttpUser, function: str, scheduled: float | None) -> None:
    """One request; Locust fires its event. If the request's greenlet is killed first (the run ended
    before the answer) or the client fails in a way Locust does not catch, a failure is fired here
    instead, so that no request sent goes unrecorded."""
    body = PLAN.bodies[function]
    sent = time.time()
    try:
        user.client.post(f"/v2/models/{function}/infer", data=body.data, headers={**body.headers, **PLAN.auth},
                         name=f"infer {function}",
                         context={"function": function, "scheduled": "" if scheduled is None else f"{scheduled:.6f}"})
    except gevent.GreenletExit:
        _failed(user, function, scheduled, sent, "client: gave up, the run ended before the answer")
        raise
    except Exception as exc:  # noqa: BLE001 - recorded, not swallowed
        _failed(user, function, scheduled, sent, f"client: {type(exc).__name__}: {exc}")


class ArrivalUser(FastHttpUser):
    """Open loop: the whole schedule, each request at its time, from one bounded pool."""

    wait_time = constant(0)
    concurrency = 1000

    @task
    def run_schedule(self) -> None:
        plan = PLAN
        pool = gevent.pool.Pool(plan.max_inflight)
        names = plan.schedule.functions
        started = time.time()
        _mark_start(started)
        for at, fid in zip(plan.schedule.times.tolist(), plan.schedule.fids.tolist()):
            delay = started + at - time.time()
            if delay > 0:
                gevent.sleep(delay)
            function = names[fid]
            if pool.full():
                reason = f"client: not sent, max in-flight {plan.max_inflight} reached"
                _refused(self, function, started + at, reason)
                continue
            pool.spawn(_send, self, function, started + at)
        if not pool.join(timeout=plan.drain_s):
            pool.kill(block=True, timeout=10)  # each one records itself as given up (see _send)
        rest = started + plan.schedule.duration_s - time.time()
        if rest > 0:  # the run lasts the whole schedule, quiet tail included: scale-in shows in the report
            gevent.sleep(rest)
        gevent.sleep(CSV_SETTLE_S)
        plan.done = True  # the shape ends the run on its next tick
        raise StopUser()  # and this user is not run again meanwhile, nor waited for at the end


def _refused(user: FastHttpUser, function: str, scheduled: float, reason: str) -> None:
    """An arrival the client could not send: a failure with its reason, never silence."""
    _failed(user, function, scheduled, scheduled, reason)


def _failed(user: FastHttpUser, function: str, scheduled: float | None, sent: float, reason: str) -> None:
    user.environment.events.request.fire(
        request_type="POST", name=f"infer {function}", response_time=(time.time() - sent) * 1000.0,
        response_length=0, response=None,
        context={"function": function, "scheduled": "" if scheduled is None else f"{scheduled:.6f}"},
        exception=RuntimeError(reason), start_time=sent, url=f"/v2/models/{function}/infer")


class InferenceUser(FastHttpUser):
    """Closed loop: the next request as soon as the last one came back."""

    wait_time = constant(0)

    def on_start(self) -> None:
        counts = np.bincount(PLAN.schedule.fids, minlength=len(PLAN.schedule.functions)).astype(float)
        self._weights = counts / counts.sum() if counts.sum() else np.full(counts.size, 1 / counts.size)
        self._rng = np.random.default_rng()

    @task
    def infer(self) -> None:
        names = PLAN.schedule.functions
        function = names[0] if len(names) == 1 else names[int(self._rng.choice(len(names), p=self._weights))]
        _send(self, function, None)


class ScenarioShape(LoadTestShape):
    """Open loop: one ArrivalUser until its schedule is done. Closed loop: users follow the offered rate."""

    def tick(self):
        plan = PLAN
        if plan is None:
            return None
        if plan.users <= 0:
            return None if plan.done else (1, 1, [ArrivalUser])
        t = self.get_run_time()
        if t >= plan.schedule.duration_s + CSV_SETTLE_S:
            return None
        if t >= plan.schedule.duration_s:  # users stop (finishing their request: --stop-timeout), CSV catches up
            return (0, plan.users, [InferenceUser])
        return (plan.schedule.users_at(plan.users, t), plan.users, [InferenceUser])

