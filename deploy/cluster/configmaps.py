"""Functions as ConfigMaps in the namespace: the spec as JSON and its revision, written by the
control API (`ConfigMapRegistry`) and read by the controller (`ConfigMapFunctions`) and the gateways.
Reading and writing live here together so the two cannot drift apart."""

from __future__ import annotations

import collections
import itertools
import json
import logging
from typing import Any, Callable

from deploy.cluster.backend import as_dict, items_of, list_items
from functions.registry import Event, FunctionRecord, NotFound
from functions.spec import FunctionSpec, spec_from_dict, spec_to_dict

log = logging.getLogger("shoal.k8s.controller")

FUNCTION_KIND_LABEL = "shoal.dev/kind=function"
# what `shoal rm` leaves of a function: its last revision, so a deploy under the name again counts on
# from it (as the SQLite registry does) and never reuses a revision a Deployment may still carry
REMOVED_KIND = "function-removed"


class ConfigMapFunctions:
    """Function specs kept as ConfigMaps in the namespace (what the control API writes)."""

    def __init__(self, core: Any, namespace: str):
        self.core, self.namespace = core, namespace
        self.broken: set[str] = set()

    def functions(self) -> dict[str, tuple[FunctionSpec, int]]:
        """The functions whose spec reads; the names of those that do not are in `self.broken`."""
        out: dict[str, tuple[FunctionSpec, int]] = {}
        broken: set[str] = set()
        for cm in list_items(self.core.list_namespaced_config_map, self.namespace, FUNCTION_KIND_LABEL):
            data = cm.get("data") or {}
            try:
                spec = spec_from_dict(json.loads(data["spec.json"]))
                out[spec.name] = (spec, int(data.get("revision", "1")))
            except (KeyError, ValueError) as exc:  # one bad ConfigMap must not stop the others
                log.warning("ConfigMap %s: not a function spec (%s)", cm["metadata"]["name"], exc)
                name = (cm["metadata"].get("labels") or {}).get("shoal.dev/function")
                if name:
                    broken.add(name)  # what runs for it is kept, not deleted
        self.broken = broken  # one assignment: the tick's thread may read it while the API's lists
        return out

    @staticmethod
    def config_map(spec_json: dict[str, Any], revision: int, namespace: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"function-{spec_json['name']}", "namespace": namespace,
                             "labels": {"shoal.dev/kind": "function", "shoal.dev/function": spec_json["name"]}},
                "data": {"spec.json": json.dumps(spec_json, sort_keys=True), "revision": str(revision)}}


def _kind_of(cm: dict[str, Any] | None) -> str | None:
    return None if cm is None else (cm["metadata"].get("labels") or {}).get("shoal.dev/kind")


def _spec_of(cm: dict[str, Any]) -> dict[str, Any] | None:
    """A function ConfigMap's spec as stored; None where it does not read (edited by hand)."""
    try:
        doc = json.loads((cm.get("data") or {})["spec.json"])
    except (KeyError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _revision_of(cm: dict[str, Any] | None) -> int:
    """The revision a function's ConfigMap records; 0 for none, or one edited into something
    that is not a number."""
    text = str(((cm or {}).get("data") or {}).get("revision", "0"))
    return int(text) if text.isdigit() else 0


class ConfigMapRegistry:
    """Functions as ConfigMaps; the registry interface deploy/api.py uses."""

    def __init__(self, core: Any, namespace: str, clock: Callable[[], float], max_events: int = 10_000):
        self.core, self.namespace, self.clock = core, namespace, clock
        self._events: collections.deque[Event] = collections.deque(maxlen=max_events)
        self._ids = itertools.count(1)

    def _read(self) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        listing = self.core.list_namespaced_config_map(self.namespace, label_selector=FUNCTION_KIND_LABEL)
        out = {}
        for cm in map(as_dict, items_of(listing)):
            data = cm.get("data") or {}
            try:
                doc = json.loads(data["spec.json"])
                out[doc["name"]] = (cm, doc)
            except (KeyError, ValueError):
                continue
        return out

    def _record(self, cm: dict[str, Any], doc: dict[str, Any]) -> FunctionRecord:
        data = cm["data"]
        return FunctionRecord(spec_from_dict(doc), int(data.get("revision", "1")),
                              float(data.get("created_at", "0")), float(data.get("updated_at", "0")))

    def list_functions(self) -> list[FunctionRecord]:
        return [self._record(cm, doc) for _, (cm, doc) in sorted(self._read().items())]

    def get_function(self, name: str) -> FunctionRecord:
        found = self._read().get(name)
        if found is None:
            raise NotFound(name)
        return self._record(*found)

    def put_function(self, spec: FunctionSpec, now: float, attempts: int = 5) -> tuple[FunctionRecord, bool]:
        """(the record, whether it changed): a new revision when the spec changed, else the same record.

        The write carries the resourceVersion it read (a create: none), so a writer that raced us
        makes ours a 409 (Conflict, or AlreadyExists on a create); then the ConfigMap is read again
        and the revision counted from what the other wrote, up to `attempts` times: no update is
        lost and no revision number is given twice."""
        return self._on_conflict_again(spec.name, attempts, lambda: self._put_once(spec, now))

    def _on_conflict_again(self, name: str, attempts: int, once: Callable[[], Any]) -> Any:
        """`once()`, which reads the function's ConfigMap and writes it with the resourceVersion it
        read, called again on a 409 (another writer came between), up to `attempts` times; any
        other error at once."""
        for attempt in range(attempts):
            try:
                return once()
            except Exception as exc:  # noqa: BLE001 - only a conflict is retried
                if getattr(exc, "status", None) != 409 or attempt == attempts - 1:
                    raise
                log.info("function %s: conflict writing its ConfigMap (%s); reading it again", name,
                         getattr(exc, "reason", exc))
        raise AssertionError("unreachable")

    def _put_once(self, spec: FunctionSpec, now: float) -> tuple[FunctionRecord, bool]:
        doc = spec_to_dict(spec)
        # the ConfigMap whatever it holds: the function (its spec as read, if it reads), what
        # `shoal rm` left of it (on from its last revision), or nothing
        prior = self._stored(spec.name)
        found = _spec_of(prior) if _kind_of(prior) == "function" else None
        if found is not None and found == doc:
            return self._record(prior, found), False
        revision = _revision_of(prior) + 1
        created = float(prior["data"].get("created_at", now)) if found is not None else now
        body = ConfigMapFunctions.config_map(doc, revision, self.namespace)
        body["data"].update(created_at=repr(created), updated_at=repr(now))
        name = body["metadata"]["name"]
        if prior is None:
            self.core.create_namespaced_config_map(self.namespace, body)  # 409 if someone created it first
        else:
            body["metadata"]["resourceVersion"] = prior["metadata"].get("resourceVersion")
            self.core.replace_namespaced_config_map(name, self.namespace, body)  # 409 if someone raced us
        return FunctionRecord(spec, revision, created, now), True

    def _stored(self, name: str) -> dict[str, Any] | None:
        """The ConfigMap of `name` whatever it holds: a function (its spec readable or not: _read
        leaves out one that does not read), or what `delete_function` left of it."""
        listing = self.core.list_namespaced_config_map(self.namespace, label_selector=f"shoal.dev/function={name}")
        items = [cm for cm in map(as_dict, items_of(listing)) if cm["metadata"]["name"] == f"function-{name}"]
        return items[0] if items else None

    def delete_function(self, name: str, attempts: int = 5) -> None:
        """The function gone from every listing; its ConfigMap kept as a marker of its last
        revision (no spec, another kind), so a deploy under the name again gets the next one: a
        controller that has not yet seen the removal (a `shoal rm` and a deploy within one of its
        ticks) sees a new revision and rolls the Deployment, never keeps the old one's template.
        A function whose spec does not read is removed too. The write carries the resourceVersion
        read, as put_function's do, and is retried on a 409."""
        self._on_conflict_again(name, attempts, lambda: self._delete_once(name))

    def _delete_once(self, name: str) -> None:
        cm = self._stored(name)
        if _kind_of(cm) != "function":
            raise NotFound(name)
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"function-{name}", "namespace": self.namespace,
                             "resourceVersion": cm["metadata"].get("resourceVersion"),
                             "labels": {"shoal.dev/kind": REMOVED_KIND, "shoal.dev/function": name}},
                "data": {"revision": str(max(1, _revision_of(cm)))}}
        self.core.replace_namespaced_config_map(f"function-{name}", self.namespace, body)

    def add_artifact(self, artifact: Any, now: float) -> None:
        """Nothing to record: the file in the PVC is the record."""

    def add_event(self, now: float, kind: str, message: str, function: str | None = None,
                  data: dict[str, Any] | None = None) -> int:
        event = Event(next(self._ids), now, function, kind, message, data)
        self._events.append(event)
        return event.id

    def events(self, function: str | None = None, after_id: int = 0, limit: int = 200) -> list[Event]:
        chosen = [e for e in self._events if (function is None or e.function == function) and e.id > after_id]
        return chosen[:limit] if after_id else chosen[-limit:]
