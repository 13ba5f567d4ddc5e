"""deploy/cluster/gateway.py, the pure part: endpoints from EndpointSlices and what to route."""

from __future__ import annotations

import pytest

from deploy.cluster.gateway import EndpointView, endpoints_from_slices, sync_actions


def endpoint_slice(function: str, *endpoints: tuple[str, str, bool, bool], port: int = 8080) -> dict:
    """endpoints: (pod, ip, ready, terminating), shaped as the EndpointSlice controller writes them."""
    return {"metadata": {"name": f"fn-{function}-abcde", "labels": {
                "kubernetes.io/service-name": f"fn-{function}", "shoal.dev/function": function,
                "app.kubernetes.io/component": "replica"}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": ready, "serving": ready,
                                                             "terminating": terminating},
                           "targetRef": {"kind": "Pod", "name": pod}} for pod, ip, ready, terminating in endpoints]}


def test_endpoints_from_slices():
    seen = endpoints_from_slices([
        endpoint_slice("digits", ("p1", "10.0.0.1", True, False), ("p2", "10.0.0.2", False, False)),
        endpoint_slice("other", ("q1", "10.0.1.1", True, True)),
        {"metadata": {"labels": {}}, "ports": [], "endpoints": []},  # not ours: ignored
    ])
    assert seen == {
        ("digits", "p1"): EndpointView("digits", "p1", "10.0.0.1", 8080, True, False),
        ("digits", "p2"): EndpointView("digits", "p2", "10.0.0.2", 8080, False, False),
        ("other", "q1"): EndpointView("other", "q1", "10.0.1.1", 8080, True, True),
    }


def test_a_slice_without_the_function_label_falls_back_to_the_service_name():
    s = endpoint_slice("digits", ("p1", "10.0.0.1", True, False))
    del s["metadata"]["labels"]["shoal.dev/function"]
    assert list(endpoints_from_slices([s])) == [("digits", "p1")]


R = EndpointView("f", "p1", "10.0.0.1", 8080, True, False)


@pytest.mark.parametrize("routed, seen, expected", [
    ({}, {("f", "p1"): R}, [("add", R)]),  # a new ready replica
    ({}, {("f", "p1"): EndpointView("f", "p1", "10.0.0.1", 8080, False, False)}, []),  # not ready yet
    ({("f", "p1"): R}, {("f", "p1"): R}, []),  # nothing changed
    ({("f", "p1"): R}, {("f", "p1"): EndpointView("f", "p1", "10.0.0.1", 8080, True, True)}, [("drain", R)]),
    ({("f", "p1"): R}, {("f", "p1"): EndpointView("f", "p1", "10.0.0.1", 8080, False, False)}, [("drain", R)]),
    ({("f", "p1"): R}, {}, [("remove", R)]),  # gone without terminating first (a node died)
])
def test_sync_actions(routed, seen, expected):
    assert sync_actions(routed, seen) == expected
