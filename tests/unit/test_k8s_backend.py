"""deploy/cluster/backend.py: plans, reconciling against a fake API server (tests/fakes/kube.py),
temporary and permanent errors, leader election. A fake clock; no cluster."""

from __future__ import annotations

import pytest

from deploy.cluster.backend import (
    Action,
    Desired,
    KubernetesBackend,
    LeaseView,
    Observed,
    Permanent,
    Temporary,
    classify,
    lease_step,
    plan,
)
from deploy.cluster.render import artifact_for
from deploy.cluster.manifests.render import Cluster
from functions.spec import spec_from_dict
from tests.fakes.kube import FakeKube, api_error

CLUSTER = Cluster()


def desired(name: str = "digits", replicas: int = 1, revision: int = 1, slice_: str = "1/4") -> Desired:
    spec = spec_from_dict({"name": name, "artifact": f"sha256:{'a' * 64}/{name}.onnx", "slice": slice_})
    return Desired(spec, revision, replicas, artifact_for(spec, "pvc", ""))


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def backend(kube: FakeKube, clock: Clock | None = None, identity: str = "a") -> KubernetesBackend:
    return KubernetesBackend(CLUSTER, kube, kube, kube, clock=clock or Clock(), identity=identity)


# ---------------------------------------------------------------------- plan (pure)


@pytest.mark.parametrize("observed, want, verbs", [
    ({}, {"digits": desired(replicas=2)}, [("create", 2)]),
    ({"digits": Observed("digits", 1, 1, 1)}, {"digits": desired(replicas=3)}, [("scale", 3)]),
    ({"digits": Observed("digits", 1, 3, 3)}, {"digits": desired(replicas=3)}, []),  # nothing to do
    ({"digits": Observed("digits", 1, 2, 2)}, {"digits": desired(replicas=2, revision=2)}, [("replace", 2)]),
    ({"digits": Observed("digits", 1, 0, 0, has_service=False)}, {"digits": desired(replicas=0)},
     [("create_service", None)]),
    ({"old": Observed("old", 4, 1, 1)}, {}, [("delete", None)]),
    ({"a": Observed("a", 1, 1, 1), "c": Observed("c", 1, 0, 0)},
     {"a": desired("a", 0), "b": desired("b", 1), "c": desired("c", 0)}, [("scale", 0), ("create", 1)]),
])
def test_plan(observed, want, verbs):
    actions = plan(CLUSTER, want, observed)
    assert [(a.verb, a.replicas) for a in actions] == verbs


def test_a_created_deployment_carries_the_desired_count_and_the_revision():
    (action,) = plan(CLUSTER, {"digits": desired(replicas=2, revision=7)}, {})
    deployment, service = action.objects
    assert deployment["spec"]["replicas"] == 2 and deployment["metadata"]["labels"]["shoal.dev/revision"] == "7"
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == "fn-digits"


def test_a_function_that_cannot_be_rendered_is_invalid_alone():
    # 1/3 is 33.3 % of the SMs: HAMi cannot express it. The other function is still planned.
    actions = plan(CLUSTER, {"bad": desired("bad", slice_="1/3"), "good": desired("good")}, {})
    assert [(a.verb, a.function) for a in actions] == [("invalid", "bad"), ("create", "good")]
    assert "whole percents" in actions[0].error
    long = "f" * 61  # fn- + 61 = 64 characters: over the 63 of a DNS label
    (action,) = plan(CLUSTER, {long: desired(long)}, {})
    assert action.verb == "invalid" and "allows 63" in action.error


def test_an_unreadable_spec_keeps_what_runs():
    # the function's ConfigMap could not be parsed this tick: not desired, but not deleted either
    assert plan(CLUSTER, {}, {"digits": Observed("digits", 1, 2, 2)}, keep=frozenset({"digits"})) == []


def test_reconcile_goes_on_past_an_invalid_function():
    kube = FakeKube()
    r = backend(kube).reconcile({"bad": desired("bad", slice_="1/3"), "good": desired("good")})
    assert r.applied == ["create good to 1"] and r.permanent["bad"].status == 422
    assert ("shoal", "fn-bad") not in kube.deployments


# ---------------------------------------------------------------------- reconcile against the fake


def test_create_scale_roll_and_delete():
    kube = FakeKube()
    b = backend(kube)
    assert b.reconcile({"digits": desired(replicas=0)}).applied == ["create digits to 0"]
    assert kube.calls[-2:] == ["create_namespaced_deployment fn-digits", "create_namespaced_service fn-digits"]
    assert b.reconcile({"digits": desired(replicas=3)}).applied == ["scale digits to 3"]
    assert kube.calls[-1] == "patch_namespaced_deployment_scale fn-digits 3"
    assert b.scale_of("digits") == 3
    assert b.reconcile({"digits": desired(replicas=3, revision=2)}).applied == ["replace digits to 3"]
    assert kube.deployments[("shoal", "fn-digits")]["metadata"]["labels"]["shoal.dev/revision"] == "2"
    assert b.reconcile({"digits": desired(replicas=3, revision=2)}).applied == []  # converged: only reads
    assert all(c.startswith("list_") for c in kube.calls[-2:])
    assert b.reconcile({}).applied == ["delete digits"]
    assert kube.deployments == {} and kube.services == {}


def test_unmanaged_deployments_are_left_alone():
    kube = FakeKube()
    kube.deployments[("shoal", "someone-elses")] = {"metadata": {"name": "someone-elses", "labels": {"app": "x"}},
                                                    "spec": {"replicas": 5}, "status": {}}
    assert backend(kube).reconcile({}).applied == []
    assert ("shoal", "someone-elses") in kube.deployments


def test_too_many_requests_waits_for_retry_after():
    kube, clock = FakeKube(), Clock()
    b = backend(kube, clock)
    b.reconcile({"digits": desired(replicas=0)})
    kube.fail("patch_namespaced_deployment_scale", api_error(429, "too many requests", retry_after="3"))
    r = b.reconcile({"digits": desired(replicas=2)})
    assert r.temporary["digits"] == Temporary(429, "too many requests", 3.0) and r.applied == []
    clock.t += 2.9  # within the server's Retry-After: not sent again
    assert b.reconcile({"digits": desired(replicas=2)}).skipped == ["scale digits to 2"]
    clock.t += 0.2
    assert b.reconcile({"digits": desired(replicas=2)}).applied == ["scale digits to 2"]
    assert kube.calls.count("patch_namespaced_deployment_scale fn-digits 2") == 2  # the failed try and the retry


def test_server_errors_back_off_without_retry_after():
    kube, clock = FakeKube(), Clock()
    b = backend(kube, clock)
    kube.fail("create_namespaced_deployment", api_error(503, "etcdserver: leader changed"),
              api_error(500, "internal error"))
    assert b.reconcile({"digits": desired()}).temporary["digits"].retry_after_s == 1.0  # back-off 1 s
    clock.t += 1.0
    assert b.reconcile({"digits": desired()}).temporary["digits"].retry_after_s == 2.0  # then 2 s
    clock.t += 2.0
    assert b.reconcile({"digits": desired()}).applied == ["create digits to 1"]
    assert b.status["digits"].attempts == 0  # reset by the success


def test_a_conflict_on_create_is_resolved_by_the_next_observation():
    kube, clock = FakeKube(), Clock()
    b = backend(kube, clock)
    other = backend(kube, clock, identity="b")
    actions = plan(CLUSTER, {"digits": desired(replicas=2)}, {})  # we observed nothing...
    other.reconcile({"digits": desired(replicas=1)})  # ...and then someone else created it
    assert [a.verb for a in actions] == ["create"]
    with pytest.raises(Exception) as err:
        b._apply(actions[0])
    assert isinstance(classify(err.value), Temporary) and classify(err.value).status == 409
    assert b.reconcile({"digits": desired(replicas=2)}).applied == ["scale digits to 2"]


def test_forbidden_is_retried_slowly_while_rbac_propagates():
    kube, clock = FakeKube(), Clock()
    b = backend(kube, clock)
    kube.fail("create_namespaced_deployment", api_error(403, 'deployments.apps is forbidden: User '
              '"system:serviceaccount:shoal:shoal-controller" cannot create resource "deployments"'))
    assert b.reconcile({"digits": desired()}).temporary["digits"].retry_after_s == 30.0
    clock.t += 30
    assert b.reconcile({"digits": desired()}).applied == ["create digits to 1"]


def test_a_deployment_deleted_behind_our_back_is_recreated():
    kube, clock = FakeKube(), Clock()
    b = backend(kube, clock)
    b.reconcile({"digits": desired(replicas=1)})
    kube.fail("patch_namespaced_deployment_scale", api_error(404, 'deployments.apps "fn-digits" not found'))
    r = b.reconcile({"digits": desired(replicas=2)})  # someone deleted it between observe and scale
    assert r.temporary["digits"] == Temporary(404, 'deployments.apps "fn-digits" not found', 0.0)
    del kube.deployments[("shoal", "fn-digits")]
    assert b.reconcile({"digits": desired(replicas=2)}).applied == ["create digits to 2"]


def test_a_new_revision_replaces_the_whole_template():
    # MIG 1/7 -> 2/7: the new pods ask for mig-2g.20gb only (a merge patch would keep mig-1g.10gb beside it)
    from deploy.cluster.manifests.gpus import Sharing

    mig = Cluster(sharing=Sharing(mode="mig"))
    kube, clock = FakeKube(), Clock()
    b = KubernetesBackend(mig, kube, kube, kube, clock=clock)
    b.reconcile({"digits": desired(slice_="1/7")})
    assert b.reconcile({"digits": desired(slice_="2/7", revision=2)}).applied == ["replace digits to 1"]
    limits = kube.deployments[("shoal", "fn-digits")]["spec"]["template"]["spec"]["containers"][0]["resources"][
        "limits"]
    assert "nvidia.com/mig-2g.20gb" in limits and "nvidia.com/mig-1g.10gb" not in limits


def test_a_replace_never_overwrites_a_newer_object():
    kube, clock = FakeKube(), Clock()
    b = backend(kube, clock)
    b.reconcile({"digits": desired()})
    kube.fail("replace_namespaced_deployment", api_error(409, 'Operation cannot be fulfilled on deployments.apps '
                                                              '"fn-digits": the object has been modified'))
    r = b.reconcile({"digits": desired(revision=2)})
    assert r.temporary["digits"].status == 409  # read again, then replace over what is there now
    clock.t += 1
    assert b.reconcile({"digits": desired(revision=2)}).applied == ["replace digits to 1"]


@pytest.mark.parametrize("status, message", [
    (400, 'Deployment in version "v1" cannot be handled as a Deployment: json: cannot unmarshal string'),
    (422, 'Deployment.apps "fn-digits" is invalid: spec.template.spec.containers[0].image: Required value'),
])
def test_permanent_errors_wait_for_a_new_revision(status, message):
    kube, clock = FakeKube(), Clock()
    b = backend(kube, clock)
    kube.fail("create_namespaced_deployment", api_error(status, message))
    r = b.reconcile({"digits": desired(revision=1)})
    assert r.permanent["digits"] == Permanent(status, message)
    clock.t += 3600  # however long: the same request would fail the same way
    assert b.reconcile({"digits": desired(revision=1)}).skipped == ["create digits to 1"]
    assert kube.calls.count("create_namespaced_deployment fn-digits") == 1
    assert b.reconcile({"digits": desired(revision=2)}).applied == ["create digits to 1"]  # a new revision: tried


def test_delete_of_what_is_gone_is_success():
    kube = FakeKube()
    b = backend(kube)
    b.reconcile({"digits": desired()})
    del kube.services[("shoal", "fn-digits")]  # the Service went away by itself
    assert b.reconcile({}).applied == ["delete digits"]


@pytest.mark.parametrize("status, headers, verdict", [
    (0, {}, Temporary(0, "connection refused", 1.0)),
    (409, {}, Temporary(409, "conflict", 1.0)),
    (429, {"Retry-After": "7"}, Temporary(429, "slow down", 7.0)),
    (503, {"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}, Temporary(503, "unavailable", 1.0)),  # a date: back-off
    (400, {}, Permanent(400, "bad")),
    (401, {}, Permanent(401, "who")),
    (403, {}, Temporary(403, "forbidden", 30.0)),
    (404, {}, Permanent(404, "gone")),
])
def test_classify(status, headers, verdict):
    exc = api_error(status, verdict.message)
    exc.headers = headers
    assert classify(exc) == verdict


def test_classify_backs_off_by_attempt():
    # 1, 2, 5, 10, 30 s, then 30 s again
    assert [classify(api_error(500, "x"), n).retry_after_s for n in range(7)] == [1, 2, 5, 10, 30, 30, 30]


# ---------------------------------------------------------------------- leader election


@pytest.mark.parametrize("lease, now, step, holder, transitions", [
    (None, 100, "create", "me", 0),
    (LeaseView("me", 95, 15, 2, "7"), 100, "renew", "me", 2),
    (LeaseView("other", 95, 15, 2, "7"), 100, "follow", None, None),  # renewed 5 s ago, 15 s lease
    (LeaseView("other", 85, 15, 2, "7"), 100, "take", "me", 3),  # 100 - 85 = 15 >= 15: expired
    (LeaseView("other", 85.1, 15, 2, "7"), 100, "follow", None, None),  # 14.9 s: still the other's
    (LeaseView(None, None, 15, 0, "7"), 100, "take", "me", 1),  # released
])
def test_lease_step(lease, now, step, holder, transitions):
    got, view = lease_step(lease, "me", now, 15)
    assert got == step
    assert (view.holder if view else None) == holder and (view.transitions if view else None) == transitions


def test_another_nodes_clock_is_never_compared_with_ours():
    # the holder's clock is an hour ahead: its renewTime is "in the future" for us. Expiry counts from when
    # we saw the renewTime change, by our clock: still 15 s, not 15 s + 1 h (nor at once if it were behind).
    kube = FakeKube()
    ahead, ours = Clock(1000.0 + 3600), Clock(1000.0)
    holder, other = backend(kube, ahead, "holder"), backend(kube, ours, "other")
    assert holder.lead(duration_s=15) is True
    assert other.lead(duration_s=15) is False  # first seen at our 1000
    ours.t += 14.9
    assert other.lead(duration_s=15) is False
    ours.t += 0.1  # 15 s after we saw it, whatever its renewTime says
    assert other.lead(duration_s=15) is True


def test_one_leader_at_a_time_and_takeover_after_expiry():
    kube, clock = FakeKube(), Clock(1000.0)
    a, b = backend(kube, clock, "a"), backend(kube, clock, "b")
    assert a.lead(duration_s=15) is True and b.lead(duration_s=15) is False
    clock.t += 10
    assert a.lead(duration_s=15) is True and b.lead(duration_s=15) is False  # renewed at 1010
    clock.t += 14.9  # a stopped renewing at 1010
    assert b.lead(duration_s=15) is False
    clock.t += 0.1  # 1025 - 1010 = 15 s: expired
    assert b.lead(duration_s=15) is True
    lease = kube.leases[("shoal", "shoal-controller")]
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    assert lease["spec"]["renewTime"] == "1970-01-01T00:17:05.000000Z"  # 1025 s after the epoch
    assert a.lead(duration_s=15) is False  # a comes back: b holds it


def test_a_lost_race_follows():
    kube, clock = FakeKube(), Clock()
    a = backend(kube, clock, "a")
    kube.fail("create_namespaced_lease", api_error(409, 'leases.coordination.k8s.io "shoal-controller" already exists'))
    assert a.lead() is False  # b created it between a's read and a's create


def test_actions_describe_themselves():
    assert Action("scale", "digits", 3).describe() == "scale digits to 3"
    assert Action("delete", "digits").describe() == "delete digits"


def test_an_outage_is_one_warning_and_one_recovery_line(caplog):
    import logging

    from deploy.cluster.backend import Outage

    now = [100.0]
    outage = Outage("endpoint sync", logging.getLogger("shoal.test.outage"), clock=lambda: now[0])
    with caplog.at_level(logging.DEBUG, logger="shoal.test.outage"):
        outage.ok()  # nothing to say while it answers
        for _ in range(20):
            outage.failed(ConnectionRefusedError("refused"))
            now[0] += 0.5
        outage.ok()
        outage.ok()
    records = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(records) == 2, records
    assert records[0][0] == "WARNING" and "does not answer (refused)" in records[0][1]
    assert records[1][0] == "INFO" and "recovered after 10.0 s (20 failed attempts)" in records[1][1]
    outage.failed("again")  # a second outage is told again
    assert len(caplog.records) == 3


def test_a_lease_that_cannot_be_read_is_one_warning_then_following(caplog):
    import logging

    from tests.fakes.kube import FakeKube, api_error

    kube = FakeKube()
    backend = KubernetesBackend(Cluster(namespace="shoal"), kube, kube, kube, clock=lambda: 1000.0, identity="me")
    assert backend.lead()
    kube.fail("read_namespaced_lease", *[api_error(503, "unavailable") for _ in range(5)])
    with caplog.at_level(logging.INFO, logger="shoal.kubernetes"):
        assert not any(backend.lead() for _ in range(5))
        assert backend.lead()  # it answers again: ours, renewed
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [lvl for lvl, _ in lines] == ["WARNING", "INFO"], lines
    assert "recovered" in lines[1][1]
