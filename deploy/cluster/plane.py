"""The control API on a cluster: `ClusterPlane` is what deploy/api.py's `create_api()` drives, as
`ControlPlane` is in `shoal up`, so `shoal deploy`, `ls`, `rm` and the SDK work unchanged through
the gateway, which forwards `/api/` to the controller. Functions are ConfigMaps
(`ConfigMapRegistry`: the spec as JSON and its revision, read by the controller and the
gateways), artifacts are files in the artifacts PVC in the artifact store's layout (mounted
read-only by the replicas), and events are the controller's own, kept in memory.
"""

from __future__ import annotations

from typing import Any, Callable

from deploy.api import write_artifact
from deploy.cluster.backend import check_names
from deploy.cluster.configmaps import ConfigMapRegistry
from deploy.cluster.manifests.render import Artifact, Cluster, render_function
from functions.artifacts import ArtifactStore
from functions.registry import FunctionRecord
from functions.spec import FunctionSpec, SpecError


class ClusterPlane:
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
