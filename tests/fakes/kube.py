"""A fake of the Kubernetes API for the backend's tests: the calls the backend makes, on objects kept
in dicts, answering as an API server does (the same status codes and Status messages), with
failures that a test can queue for the next call of a method. Every call is logged in `calls`."""

from __future__ import annotations

import copy
import json
from typing import Any

from kubernetes.client.exceptions import ApiException

REASONS = {403: "Forbidden", 404: "Not Found", 409: "Conflict", 422: "Unprocessable Entity",
           429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}


def api_error(status: int, message: str, retry_after: str | None = None) -> ApiException:
    """An ApiException as the client raises it: status, reason, a Status body, the headers."""
    exc = ApiException(status=status, reason=REASONS.get(status, ""))
    exc.body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                           "reason": REASONS.get(status, "").replace(" ", ""), "code": status})
    exc.headers = {"Content-Type": "application/json", **({"Retry-After": retry_after} if retry_after else {})}
    return exc


def _matches(labels: dict[str, str], selector: str | None) -> bool:
    if not selector:
        return True
    return all(labels.get(k) == v for k, _, v in (term.partition("=") for term in selector.split(",")))


class FakeKube:
    def __init__(self) -> None:
        self.deployments: dict[tuple[str, str], dict[str, Any]] = {}
        self.services: dict[tuple[str, str], dict[str, Any]] = {}
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.config_maps: dict[tuple[str, str], dict[str, Any]] = {}
        self.endpoint_slices: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[str] = []
        self.failures: dict[str, list[ApiException]] = {}
        self._version = 100

    def fail(self, method: str, *errors: ApiException) -> None:
        self.failures.setdefault(method, []).extend(errors)

    def _call(self, method: str, detail: str) -> None:
        self.calls.append(f"{method} {detail}")
        queue = self.failures.get(method)
        if queue:
            raise queue.pop(0)

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    # apps/v1 Deployments and their scale subresource
    def list_namespaced_deployment(self, namespace: str, label_selector: str | None = None,
                                   _preload_content: bool = True) -> dict[str, Any]:
        self._call("list_namespaced_deployment", namespace)
        return {"items": [copy.deepcopy(d) for (ns, _), d in sorted(self.deployments.items())
                          if ns == namespace and _matches(d["metadata"].get("labels", {}), label_selector)]}

    def create_namespaced_deployment(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        self._call("create_namespaced_deployment", name)
        if (namespace, name) in self.deployments:
            raise api_error(409, f'deployments.apps "{name}" already exists')
        d = copy.deepcopy(body)
        d["metadata"]["resourceVersion"] = self._next_version()
        d["status"] = {"replicas": 0, "readyReplicas": 0}
        self.deployments[(namespace, name)] = d
        return d

    def replace_namespaced_deployment(self, name: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """PUT: the whole object, only over the resourceVersion it was read at (else 409)."""
        self._call("replace_namespaced_deployment", name)
        current = self._deployment(name, namespace)
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise api_error(409, f'Operation cannot be fulfilled on deployments.apps "{name}": the object has '
                                 "been modified; please apply your changes to the latest version and try again")
        d = copy.deepcopy(body)
        d["metadata"]["resourceVersion"] = self._next_version()
        d["status"] = current["status"]
        self.deployments[(namespace, name)] = d
        return d

    def patch_namespaced_deployment_scale(self, name: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self._call("patch_namespaced_deployment_scale", f"{name} {body['spec']['replicas']}")
        d = self._deployment(name, namespace)
        d["spec"]["replicas"] = body["spec"]["replicas"]
        d["metadata"]["resourceVersion"] = self._next_version()
        return self.read_namespaced_deployment_scale(name, namespace, log=False)

    def read_namespaced_deployment_scale(self, name: str, namespace: str, log: bool = True) -> dict[str, Any]:
        if log:
            self._call("read_namespaced_deployment_scale", name)
        d = self._deployment(name, namespace)
        return {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": name, "namespace": namespace},
                "spec": {"replicas": d["spec"]["replicas"]}, "status": {"replicas": d["status"]["replicas"]}}

    def delete_namespaced_deployment(self, name: str, namespace: str) -> dict[str, Any]:
        self._call("delete_namespaced_deployment", name)
        self._deployment(name, namespace)
        del self.deployments[(namespace, name)]
        return {"kind": "Status", "status": "Success"}

    def _deployment(self, name: str, namespace: str) -> dict[str, Any]:
        if (namespace, name) not in self.deployments:
            raise api_error(404, f'deployments.apps "{name}" not found')
        return self.deployments[(namespace, name)]

    # v1 Services
    def list_namespaced_service(self, namespace: str, label_selector: str | None = None,
                                _preload_content: bool = True) -> dict[str, Any]:
        self._call("list_namespaced_service", namespace)
        return {"items": [copy.deepcopy(s) for (ns, _), s in sorted(self.services.items())
                          if ns == namespace and _matches(s["metadata"].get("labels", {}), label_selector)]}

    def create_namespaced_service(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        self._call("create_namespaced_service", name)
        if (namespace, name) in self.services:
            raise api_error(409, f'services "{name}" already exists')
        self.services[(namespace, name)] = copy.deepcopy(body)
        return body

    def delete_namespaced_service(self, name: str, namespace: str) -> dict[str, Any]:
        self._call("delete_namespaced_service", name)
        if (namespace, name) not in self.services:
            raise api_error(404, f'services "{name}" not found')
        del self.services[(namespace, name)]
        return {"kind": "Status", "status": "Success"}

    # v1 ConfigMaps
    def list_namespaced_config_map(self, namespace: str, label_selector: str | None = None,
                                   _preload_content: bool = True) -> dict[str, Any]:
        self._call("list_namespaced_config_map", namespace)
        return {"items": [copy.deepcopy(c) for (ns, _), c in sorted(self.config_maps.items())
                          if ns == namespace and _matches(c["metadata"].get("labels", {}), label_selector)]}

    def create_namespaced_config_map(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        self._call("create_namespaced_config_map", name)
        if (namespace, name) in self.config_maps:
            raise api_error(409, f'configmaps "{name}" already exists')
        cm = copy.deepcopy(body)
        cm["metadata"]["resourceVersion"] = self._next_version()
        self.config_maps[(namespace, name)] = cm
        return cm

    def replace_namespaced_config_map(self, name: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self._call("replace_namespaced_config_map", name)
        current = self.config_maps.get((namespace, name))
        if current is None:
            raise api_error(404, f'configmaps "{name}" not found')
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise api_error(409, f'Operation cannot be fulfilled on configmaps "{name}": the object has been '
                                 "modified; please apply your changes to the latest version and try again")
        cm = copy.deepcopy(body)
        cm["metadata"]["resourceVersion"] = self._next_version()
        self.config_maps[(namespace, name)] = cm
        return cm

    # discovery.k8s.io/v1 EndpointSlices (written by the test, as the EndpointSlice controller would)
    def list_namespaced_endpoint_slice(self, namespace: str, label_selector: str | None = None,
                                       _preload_content: bool = True) -> dict[str, Any]:
        self._call("list_namespaced_endpoint_slice", namespace)
        return {"items": [copy.deepcopy(e) for (ns, _), e in sorted(self.endpoint_slices.items())
                          if ns == namespace and _matches(e["metadata"].get("labels", {}), label_selector)]}

    def delete_namespaced_config_map(self, name: str, namespace: str) -> dict[str, Any]:
        self._call("delete_namespaced_config_map", name)
        if (namespace, name) not in self.config_maps:
            raise api_error(404, f'configmaps "{name}" not found')
        del self.config_maps[(namespace, name)]
        return {"kind": "Status", "status": "Success"}

    # coordination.k8s.io/v1 Leases
    def read_namespaced_lease(self, name: str, namespace: str) -> dict[str, Any]:
        self._call("read_namespaced_lease", name)
        if (namespace, name) not in self.leases:
            raise api_error(404, f'leases.coordination.k8s.io "{name}" not found')
        return copy.deepcopy(self.leases[(namespace, name)])

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        self._call("create_namespaced_lease", f"{name} {body['spec']['holderIdentity']}")
        if (namespace, name) in self.leases:
            raise api_error(409, f'leases.coordination.k8s.io "{name}" already exists')
        lease = copy.deepcopy(body)
        lease["metadata"]["resourceVersion"] = self._next_version()
        self.leases[(namespace, name)] = lease
        return lease

    def replace_namespaced_lease(self, name: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self._call("replace_namespaced_lease", f"{name} {body['spec']['holderIdentity']}")
        current = self.leases.get((namespace, name))
        if current is None:
            raise api_error(404, f'leases.coordination.k8s.io "{name}" not found')
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise api_error(409, f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": the object '
                                 "has been modified; please apply your changes to the latest version and try again")
        lease = copy.deepcopy(body)
        lease["metadata"]["resourceVersion"] = self._next_version()
        self.leases[(namespace, name)] = lease
        return lease
