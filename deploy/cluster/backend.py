"""The Kubernetes backend: each function a Deployment + Service (render_function), scaled by the
controller through the Deployment's scale subresource; one controller active at a time, by Lease.

Two halves:
- pure: `plan(desired, observed)` is the list of `Action`s that brings the cluster to what the
  controller wants (create, roll to a new revision, scale, remove), and `lease_step(...)` is one
  round of leader election. Neither calls the API nor reads a clock.
- `KubernetesBackend` observes the namespace, applies a plan through the official client, and
  sorts API errors into `Temporary` (retry after the delay the server gave, or a back-off:
  409 conflicts, 429, 5xx, connection errors) and `Permanent` (400, 401, 403, 404 on a write,
  422: retrying the same request cannot help). A function whose action failed temporarily is
  left alone until its retry time; one that failed permanently is left alone until its spec
  changes. A 404 on a delete is success (already gone).

The API objects are whatever the client returns (pydantic models in kubernetes >= 37, dicts from
a test's fake); `as_dict` gives the camelCase JSON form of either.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from autoscaler.loop import Fleet, Target
from deploy.cluster.manifests.labels import FUNCTION_LABEL, MANAGED, PART
from deploy.cluster.manifests.render import Artifact, Cluster, render_function
from functions.spec import FunctionSpec

log = logging.getLogger("shoal.kubernetes")

REPLICA_SELECTOR = f"{MANAGED}=shoal,{PART}=replica"
REVISION_LABEL = "shoal.dev/revision"
DEFAULT_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)


# ---------------------------------------------------------------------- pure: plan


@dataclass(frozen=True)
class Desired:
    spec: FunctionSpec
    revision: int
    replicas: int
    artifact: Artifact


@dataclass(frozen=True)
class Observed:
    """One function as the cluster has it."""

    function: str
    revision: int | None
    replicas: int  # spec.replicas
    ready: int
    has_service: bool = True
    has_deployment: bool = True
    resource_version: str | None = None  # the Deployment's, for a replace that cannot overwrite a newer one


@dataclass(frozen=True)
class Action:
    verb: str  # create | replace | scale | create_service | delete | invalid
    function: str
    replicas: int | None = None
    objects: tuple[dict[str, Any], ...] = ()
    error: str | None = None  # invalid: why the function cannot be rendered (nothing is sent)

    def describe(self) -> str:
        extra = f" to {self.replicas}" if self.replicas is not None else ""
        return f"{self.verb} {self.function}{extra}"


def plan(cluster: Cluster, desired: dict[str, Desired], observed: dict[str, Observed],
         keep: frozenset[str] = frozenset()) -> list[Action]:
    """What to do, function by function, in name order (deterministic). `keep`: functions whose spec
    could not be read this time; what runs for them is left as it is, never deleted. A function that
    cannot be rendered (a slice its mode cannot express, a name too long for its objects) is an
    `invalid` action for itself alone: the others are still planned."""
    actions: list[Action] = []
    for name in sorted(set(desired) | set(observed)):
        want, have = desired.get(name), observed.get(name)
        if want is None:
            if name not in keep:
                actions.append(Action("delete", name))
            continue
        try:
            deployment, service = render_function(cluster, want.spec, want.artifact, want.revision)
            check_names(deployment, service)
        except ValueError as exc:  # ManifestError is a ValueError
            actions.append(Action("invalid", name, error=str(exc)))
            continue
        deployment["spec"]["replicas"] = want.replicas
        if have is not None:
            deployment["metadata"]["resourceVersion"] = have.resource_version
        if have is None or not have.has_deployment:
            actions.append(Action("create", name, want.replicas, (deployment, service)))
            continue
        if have.revision != want.revision:
            actions.append(Action("replace", name, want.replicas, (deployment,)))
        elif have.replicas != want.replicas:
            actions.append(Action("scale", name, want.replicas))
        if not have.has_service:
            actions.append(Action("create_service", name, None, (service,)))
    return actions


def check_names(*objects: dict[str, Any]) -> None:
    """Object names are DNS labels (Services: at most 63 characters); say so before the API does."""
    for obj in objects:
        name = obj["metadata"]["name"]
        if len(name) > 63:
            raise ValueError(f"{obj['kind']} name {name!r} is {len(name)} characters; Kubernetes allows 63 "
                             f"(function names up to {63 - len('fn-')} characters on a cluster)")


# ---------------------------------------------------------------------- pure: leader election


@dataclass(frozen=True)
class LeaseView:
    holder: str | None
    renewed_at: float | None  # seconds since the epoch
    duration_s: float
    transitions: int = 0
    resource_version: str | None = None


def lease_step(lease: LeaseView | None, me: str, now: float, duration_s: float) -> tuple[str, LeaseView | None]:
    """One round: ("create" | "renew" | "take" | "follow", the lease to write, or None to write nothing).

    A lease held by someone else is taken only once it has not been renewed for its duration;
    ours is renewed. Writes carry the read resourceVersion, so of two candidates only one wins
    (the other's write is a 409 and it follows)."""
    if lease is None:
        return "create", LeaseView(me, now, duration_s, 0, None)
    if lease.holder == me:
        return "renew", LeaseView(me, now, duration_s, lease.transitions, lease.resource_version)
    expired = lease.renewed_at is None or now - lease.renewed_at >= lease.duration_s
    if expired:
        return "take", LeaseView(me, now, duration_s, lease.transitions + 1, lease.resource_version)
    return "follow", None


def lease_body(name: str, namespace: str, view: LeaseView, acquired_at: float) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if view.resource_version:
        meta["resourceVersion"] = view.resource_version
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": view.holder, "leaseDurationSeconds": int(view.duration_s),
                     "acquireTime": _micro(acquired_at), "renewTime": _micro(view.renewed_at),
                     "leaseTransitions": view.transitions}}


def _micro(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    text = str(value).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


# ---------------------------------------------------------------------- errors


@dataclass(frozen=True)
class Temporary:
    status: int
    message: str
    retry_after_s: float


@dataclass(frozen=True)
class Permanent:
    status: int
    message: str


def classify(exc: Exception, attempt: int = 0) -> Temporary | Permanent:
    """An API error: Temporary with the delay to wait (the server's Retry-After, else a back-off by
    attempt), or Permanent."""
    status = int(getattr(exc, "status", 0) or 0)
    message = _message(exc)
    if status == 403:  # RBAC being applied or propagating: try again, slowly
        return Temporary(status, message, DEFAULT_BACKOFF_S[-1])
    if status in (0, 409, 429) or status >= 500:
        headers = getattr(exc, "headers", None) or {}
        retry = headers.get("Retry-After") or headers.get("retry-after")
        try:
            delay = float(retry) if retry is not None else DEFAULT_BACKOFF_S[min(attempt, len(DEFAULT_BACKOFF_S) - 1)]
        except ValueError:  # an HTTP date instead of seconds: use the back-off
            delay = DEFAULT_BACKOFF_S[min(attempt, len(DEFAULT_BACKOFF_S) - 1)]
        return Temporary(status, message, max(0.0, delay))
    return Permanent(status, message)


def _message(exc: Exception) -> str:
    import json

    body = getattr(exc, "body", None)
    if body:
        try:
            return str(json.loads(body).get("message", body))
        except (ValueError, AttributeError):
            return str(body)[:300]
    return str(getattr(exc, "reason", None) or exc)


# ---------------------------------------------------------------------- the API side


_SERIALIZER: Any = None


def as_dict(obj: Any) -> dict[str, Any]:
    """One ApiClient serializes them all: a new one per object built a Configuration each time
    (3 ms apiece: 12 s of a tick at 2,000 functions, two objects each)."""
    global _SERIALIZER
    if isinstance(obj, dict):
        return obj
    if _SERIALIZER is None:
        from kubernetes.client import ApiClient

        _SERIALIZER = ApiClient()
    return _SERIALIZER.sanitize_for_serialization(obj)


@dataclass
class FunctionStatus:
    retry_at: float = 0.0
    attempts: int = 0
    blocked: str | None = None  # a permanent error, until the revision changes
    blocked_revision: int | None = None


@dataclass
class ReconcileResult:
    applied: list[str] = field(default_factory=list)
    temporary: dict[str, Temporary] = field(default_factory=dict)
    permanent: dict[str, Permanent] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


class KubernetesBackend:
    """Applies plans through AppsV1Api / CoreV1Api / CoordinationV1Api (or a fake with the same methods)."""

    def __init__(self, cluster: Cluster, apps: Any, core: Any, coordination: Any | None = None,
                 clock: Callable[[], float] | None = None, identity: str = "shoal-controller"):
        import time

        self.cluster, self.apps, self.core, self.coordination = cluster, apps, core, coordination
        self.clock = clock or time.time
        self.identity = identity
        self.status: dict[str, FunctionStatus] = {}
        self.acquired_at: float | None = None
        self._lease_seen: tuple[tuple, float] | None = None  # (the other holder's lease as read, when we saw it)
        self.outage = Outage("controller", log)

    @classmethod
    def from_kubeconfig(cls, cluster: Cluster, identity: str) -> "KubernetesBackend":
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(cluster, client.AppsV1Api(), client.CoreV1Api(), client.CoordinationV1Api(), identity=identity)

    # observe

    def observe(self) -> dict[str, Observed]:
        ns = self.cluster.namespace
        deployments = list_items(self.apps.list_namespaced_deployment, ns, REPLICA_SELECTOR)
        services = {s["metadata"]["labels"].get(FUNCTION_LABEL)
                    for s in list_items(self.core.list_namespaced_service, ns, REPLICA_SELECTOR)}
        out: dict[str, Observed] = {}
        for d in deployments:
            labels = d["metadata"].get("labels") or {}
            function = labels.get(FUNCTION_LABEL)
            if not function:
                continue
            revision = labels.get(REVISION_LABEL)
            status = d.get("status") or {}
            out[function] = Observed(function, int(revision) if revision and revision.isdigit() else None,
                                     int(d["spec"].get("replicas") or 0), int(status.get("readyReplicas") or 0),
                                     has_service=function in services,
                                     resource_version=d["metadata"].get("resourceVersion"))
        return out

    # apply

    def reconcile(self, desired: dict[str, Desired], keep: frozenset[str] = frozenset(),
                  observed: dict[str, Observed] | None = None) -> ReconcileResult:
        """Bring the cluster to `desired`. `observed`: what this tick's `observe()` saw (the
        controller's tick passes it, so a tick lists each kind once); None looks again. A write
        from a stale look is safe: a replace carries the resourceVersion seen (409), a create of
        what exists is a 409, a scale or a replace of what went is a 404: each is retried."""
        now = self.clock()
        result = ReconcileResult()
        if observed is None:
            observed = self.observe()
        for action in plan(self.cluster, desired, observed, keep):
            st = self.status.setdefault(action.function, FunctionStatus())
            want = desired.get(action.function)
            if action.verb == "invalid":
                result.permanent[action.function] = Permanent(422, action.error or "")
                log.warning("%s: %s", action.function, action.error)
                continue
            if st.blocked and want is not None and want.revision == st.blocked_revision:
                result.skipped.append(action.describe())
                continue
            if now < st.retry_at:
                result.skipped.append(action.describe())
                continue
            try:
                self._apply(action)
            except Exception as exc:  # noqa: BLE001 - sorted below; anything unknown is permanent
                verdict = classify(exc, st.attempts)
                if getattr(exc, "status", None) == 404 and action.verb in ("scale", "replace", "create_service"):
                    # it went away between our look and our write: look again next tick
                    verdict = Temporary(404, verdict.message, 0.0)
                if isinstance(verdict, Temporary):
                    st.attempts += 1
                    st.retry_at = now + verdict.retry_after_s
                    result.temporary[action.function] = verdict
                    log.info("%s: temporary %s (%s), retry in %.1f s", action.describe(), verdict.status,
                             verdict.message, verdict.retry_after_s)
                else:
                    st.blocked, st.blocked_revision = verdict.message, want.revision if want else None
                    result.permanent[action.function] = verdict
                    log.warning("%s: %s %s", action.describe(), verdict.status, verdict.message)
                continue
            st.attempts, st.retry_at, st.blocked = 0, 0.0, None
            result.applied.append(action.describe())
        for name in set(self.status) - set(desired) - set(observed):
            del self.status[name]  # deleted and gone
        return result

    def _apply(self, action: Action) -> None:
        ns, name = self.cluster.namespace, f"fn-{action.function}"
        if action.verb == "create":
            deployment, service = action.objects
            self.apps.create_namespaced_deployment(ns, deployment)
            self._create_service(ns, service)
        elif action.verb == "replace":
            (deployment,) = action.objects
            # a replace, not a patch: a strategic merge would keep the old revision's map keys (a MIG
            # resource, a node selector) beside the new ones. It carries the resourceVersion we saw,
            # so a newer object is never overwritten (409).
            self.apps.replace_namespaced_deployment(name, ns, deployment)
        elif action.verb == "scale":
            self.apps.patch_namespaced_deployment_scale(name, ns, {"spec": {"replicas": action.replicas}})
        elif action.verb == "create_service":
            self._create_service(ns, action.objects[0])
        elif action.verb == "delete":
            for call in (self.apps.delete_namespaced_deployment, self.core.delete_namespaced_service):
                try:
                    call(name, ns)
                except Exception as exc:  # noqa: BLE001
                    if getattr(exc, "status", None) != 404:  # already gone is what we wanted
                        raise
        else:
            raise ValueError(f"unknown action {action.verb!r}")

    def _create_service(self, ns: str, service: dict[str, Any]) -> None:
        try:
            self.core.create_namespaced_service(ns, service)
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "status", None) != 409:  # it exists: fine
                raise

    def scale_of(self, function: str) -> int:
        scale = as_dict(self.apps.read_namespaced_deployment_scale(f"fn-{function}", self.cluster.namespace))
        return int((scale.get("spec") or {}).get("replicas") or 0)

    # leader election

    def lead(self, lease_name: str = "shoal-controller", duration_s: float = 15.0) -> bool:
        """One round of leader election; True while this controller holds the Lease.

        Another holder's lease expires `duration` after *we* saw its renewTime change, by our own
        clock, as client-go does: clocks of different nodes are never compared."""
        ns, now = self.cluster.namespace, self.clock()
        try:
            current = self._read_lease(lease_name)
        except Exception as exc:  # noqa: BLE001
            self.outage.failed(f"lease {lease_name}: {_message(exc)}; following until it answers")
            return False
        self.outage.ok()
        if current is not None and current.holder != self.identity:
            seen = (current.holder, current.renewed_at, current.resource_version)
            if self._lease_seen is None or self._lease_seen[0] != seen:
                self._lease_seen = (seen, now)
            current = LeaseView(current.holder, self._lease_seen[1] if current.holder else None,
                                current.duration_s, current.transitions, current.resource_version)
        step, view = lease_step(current, self.identity, now, duration_s)
        if view is None:
            self.acquired_at = None
            return False
        if step != "renew":
            self.acquired_at = now
        body = lease_body(lease_name, ns, view, self.acquired_at or now)
        try:
            if step == "create":
                self.coordination.create_namespaced_lease(ns, body)
            else:
                self.coordination.replace_namespaced_lease(lease_name, ns, body)
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "status", None) == 409:  # another candidate wrote first
                self.acquired_at = None
                return False
            raise
        return True

    def _read_lease(self, name: str) -> LeaseView | None:
        try:
            lease = as_dict(self.coordination.read_namespaced_lease(name, self.cluster.namespace))
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "status", None) == 404:
                return None
            raise
        spec = lease.get("spec") or {}
        return LeaseView(spec.get("holderIdentity"), _parse_time(spec.get("renewTime")),
                         float(spec.get("leaseDurationSeconds") or 15), int(spec.get("leaseTransitions") or 0),
                         (lease.get("metadata") or {}).get("resourceVersion"))


def list_items(call: Callable[..., Any], namespace: str, label_selector: str) -> list[dict[str, Any]]:
    """A namespaced list call's items as plain dicts, from the answer's JSON (`_preload_content=False`):
    the client's models are not built (pydantic validates every field of every object) only to be
    turned back into dicts, which at 2,000 functions was most of a tick. A fake answers a dict."""
    import json

    listing = call(namespace, label_selector=label_selector, _preload_content=False)
    if isinstance(listing, dict):
        return [as_dict(x) for x in items_of(listing)]
    return json.loads(listing.data).get("items") or []


def items_of(listing: Any) -> list[Any]:
    """The items of a list answer: a dict (a test's fake) or the client's model."""
    if isinstance(listing, dict):
        return listing.get("items") or []
    return list(getattr(listing, "items", None) or [])


# ---------------------------------------------------------------------- the loop's Scaler


class KubernetesScaler:
    """The control loop's Scaler on a cluster: Deployments observed, every function's count
    applied at once by `KubernetesBackend.reconcile` (a plan over all of them: one left out
    would be deleted), and only while this controller still holds the Lease (a slow tick may
    have lost it)."""

    def __init__(self, backend: KubernetesBackend, artifact: Callable[[FunctionSpec], Artifact],
                 lease: str = "shoal-controller", lease_s: float = 15.0):
        self.backend, self.artifact, self.lease, self.lease_s = backend, artifact, lease, lease_s
        self.observed: dict[str, Observed] = {}
        self.applied: list[str] = []
        self.lost_lease = False

    def observe(self, functions: dict[str, tuple[FunctionSpec, int]]) -> dict[str, Fleet]:
        self.observed = self.backend.observe()
        return {name: Fleet(seen.replicas, seen.ready) for name, seen in self.observed.items()}

    def slice_for(self, spec: FunctionSpec) -> float:
        return float(spec.slice.fraction)  # a new slice is a new revision of the Deployment

    async def apply(self, targets: dict[str, Target], keep: frozenset[str]) -> dict[str, int]:
        desired = {name: Desired(t.spec, t.revision, t.desired, self.artifact(t.spec)) for name, t in targets.items()}
        self.applied = []
        self.lost_lease = not self.backend.lead(self.lease, self.lease_s)
        if self.lost_lease:
            return {}
        self.applied = self.backend.reconcile(desired, keep, self.observed).applied  # this tick's look
        changed = {}
        for action in self.applied:
            verb, name = action.split(" ")[:2]
            if verb in ("scale", "create"):
                changed[name] = self.observed[name].replicas if name in self.observed else 0
        return changed


# ---------------------------------------------------------------------- outages


class Outage:
    """One warning when the API server stops answering, one line when it answers again, and
    nothing in between (a role that retries every second must not log every second). `clock`:
    monotonic seconds."""

    def __init__(self, what: str, logger: logging.Logger, clock: Callable[[], float] | None = None):
        import time

        self.what, self.log, self.clock = what, logger, clock or time.monotonic
        self.since: float | None = None
        self.failures = 0

    def failed(self, exc: BaseException | str) -> None:
        self.failures += 1
        if self.since is None:
            self.since = self.clock()
            self.log.warning("%s: the API server does not answer (%s); keeping what we have, retrying",
                             self.what, exc if isinstance(exc, str) else _message(exc))  # type: ignore[arg-type]

    def ok(self) -> None:
        if self.since is not None:
            self.log.info("%s: the API server answers again; recovered after %.1f s (%d failed attempts)",
                          self.what, self.clock() - self.since, self.failures)
        self.since, self.failures = None, 0


def quiet_client_retries() -> None:
    """urllib3 logs a WARNING for each of its own retries of a refused connection (three a call):
    the roles say an outage once (Outage), so these are kept to errors."""
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
