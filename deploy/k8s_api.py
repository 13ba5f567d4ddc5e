"""The control API on a cluster: the same `/api/v1` as `shoal up` (deploy/api.py), so `shoal deploy`,
`shoal ls`, `shoal rm` and the SDK work unchanged against a cluster.

The controller serves it. The gateway forwards `/api/` to it, so a client needs only the
gateway's URL. On the cluster:
- functions are ConfigMaps (`ConfigMapRegistry`: the spec as JSON and its revision, written by
  the API and read by the controller and the gateways);
- artifacts are files in the artifacts PVC, in the artifact store's own layout (the replicas
  mount it read-only);
- events are the controller's own, kept in memory.

`ClusterPlane` is the object `create_api()` drives, as `ControlPlane` is in `shoal up`.
"""

from __future__ import annotations

import collections
import itertools
import json
from typing import Any, Callable

from deploy.api import write_artifact
from deploy.backends.kubernetes import as_dict, check_names, items_of
from deploy.k8s_controller import FUNCTION_KIND_LABEL, ConfigMapFunctions
from deploy.manifests.render import Artifact, Cluster, render_function
from functions.artifacts import ArtifactStore
from functions.registry import Event, FunctionRecord, NotFound
from functions.spec import FunctionSpec, SpecError, spec_from_dict, spec_to_dict


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

    def put_function(self, spec: FunctionSpec, now: float) -> tuple[FunctionRecord, bool]:
        """(the record, whether it changed): a new revision when the spec changed, else the same record."""
        doc = spec_to_dict(spec)
        found = self._read().get(spec.name)
        if found is not None and found[1] == doc:
            return self._record(*found), False
        revision = int(found[0]["data"].get("revision", "0")) + 1 if found else 1
        created = float(found[0]["data"].get("created_at", now)) if found else now
        body = ConfigMapFunctions.config_map(doc, revision, self.namespace)
        body["data"].update(created_at=repr(created), updated_at=repr(now))
        name = body["metadata"]["name"]
        if found is None:
            self.core.create_namespaced_config_map(self.namespace, body)
        else:
            body["metadata"]["resourceVersion"] = found[0]["metadata"].get("resourceVersion")
            self.core.replace_namespaced_config_map(name, self.namespace, body)  # 409 if someone raced us
        return FunctionRecord(spec, revision, created, now), True

    def delete_function(self, name: str) -> None:
        self.get_function(name)
        self.core.delete_namespaced_config_map(f"function-{name}", self.namespace)

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


class ClusterPlane:
    """What deploy/api.py's create_api() needs, on a cluster."""

    def __init__(self, registry: ConfigMapRegistry, store: ArtifactStore, token: str,
                 status: Callable[[], dict[str, Any]], inventory: Callable[[], dict[str, Any]],
                 changed: Callable[[str], None], cluster: Cluster | None = None):
        self.registry, self.store, self.token = registry, store, token
        self._status, self._inventory, self._changed = status, inventory, changed
        self.cluster = cluster or Cluster()

    def check(self, spec: FunctionSpec) -> None:
        """Refuse at deploy (400) what the cluster could not run: a slice its GPU sharing mode cannot
        express, a name too long for the function's objects."""
        try:
            deployment, service = render_function(self.cluster, spec, Artifact("pvc", "check/model"))
            check_names(deployment, service)
        except ValueError as exc:
            raise SpecError(f"{spec.name}: {exc}") from None

    async def store_artifact(self, stream, filename: str):
        return await write_artifact(self.store, stream, filename)  # the file on the PVC is the record

    def put_function(self, spec: FunctionSpec) -> FunctionRecord:
        self.check(spec)
        record, changed = self.registry.put_function(spec, self.registry.clock())
        if changed:
            self.registry.add_event(self.registry.clock(), "deploy", f"{spec.name} revision {record.revision}",
                                    spec.name, {"revision": record.revision})
            self._changed(spec.name)
        return record

    def delete_function(self, name: str) -> None:
        self.registry.delete_function(name)
        self.registry.add_event(self.registry.clock(), "delete", f"{name} removed", name)
        self._changed(name)

    def function_view(self, record: FunctionRecord) -> dict[str, Any]:
        name = record.spec.name
        return {**record.to_json(), "endpoints": {"v2": f"/v2/models/{name}/infer", "v1": f"/v1/models/{name}:predict"}}

    def status(self) -> dict[str, Any]:
        return self._status()

    def inventory_view(self) -> dict[str, Any]:
        return self._inventory()
