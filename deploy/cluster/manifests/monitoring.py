"""Prometheus Operator objects and a Grafana dashboard for Shoal (pure): ServiceMonitors, a
PrometheusRule (SLO burn-rate alerts, cold-start storms, activator backlog) and the dashboard
ConfigMap, on the metric names Shoal exports (DESIGN.md section 5). What each holds is listed
in docs/kubernetes.md, "Monitoring".
"""

from __future__ import annotations

import json
from typing import Any

from deploy.cluster.manifests.labels import labels, selector

OBJECTIVES = {"Latency": 0.95, "Availability": 0.999}  # a p95 latency SLO allows 5 % slow; errors 0.1 %
# the default slo_p95_ms (100 ms) as a bucket bound of shoal_gateway_request_duration_seconds
SLO_BUCKET_S = "0.1"
BURNS = (("fast", 14.4, "1h", "5m", "critical", "2m"), ("slow", 6.0, "6h", "30m", "warning", "15m"))


def service_monitors(cluster) -> list[dict[str, Any]]:
    out = []
    for component, port in (("gateway", "http"), ("controller", "http"), ("replica", "http")):
        out.append({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {"name": f"shoal-{component}", "namespace": cluster.namespace, "labels": labels("monitoring")},
            "spec": {"selector": {"matchLabels": selector(component)},
                     "namespaceSelector": {"matchNames": [cluster.namespace]},
                     "endpoints": [{"port": port, "path": "/metrics", "interval": "5s" if component == "replica" else
                                    "15s", "scrapeTimeout": "4s"}]},
        })
    return out


def _slow_share(window: str) -> str:
    """The share of requests slower than the SLO bucket: 1 - (requests within it / all requests)."""
    within = f'shoal_gateway_request_duration_seconds_bucket{{le="{SLO_BUCKET_S}"}}'
    return (f"1 - sum by (function) (rate({within}[{window}]))\n"
            f"  / sum by (function) (rate(shoal_gateway_request_duration_seconds_count[{window}]))")


def _error_share(window: str) -> str:
    return (f'sum by (function) (rate(shoal_gateway_requests_total{{code!~"2.."}}[{window}]))\n'
            f"  / sum by (function) (rate(shoal_gateway_requests_total[{window}]))")


def prometheus_rule(cluster) -> dict[str, Any]:
    rules: list[dict[str, Any]] = []
    for name, factor, long, short, severity, hold in BURNS:
        for kind, share in (("Latency", _slow_share), ("Availability", _error_share)):
            objective = OBJECTIVES[kind]
            budget = 1 - objective
            expr = (f"(\n  {share(long)}\n) > {factor} * {budget:g}\nand\n"
                    f"(\n  {share(short)}\n) > {factor} * {budget:g}")
            rules.append({
                "alert": f"ShoalSLO{kind}Burn{name.capitalize()}", "expr": expr, "for": hold,
                "labels": {"severity": severity},
                "annotations": {
                    "summary": f"{{{{ $labels.function }}}} burns its {kind.lower()} error budget {factor}x too fast",
                    "description": f"Over {long} and {short}, more than {factor * budget * 100:.2f}% of requests to "
                                   f"{{{{ $labels.function }}}} were "
                                   + ("slower than the SLO bucket." if kind == "Latency" else "answered with an error.")
                                   + f" At this rate the {objective:.1%} objective's 30-day budget lasts "
                                   f"{30 / factor:.1f} days."}})
    rules += [
        {"alert": "ShoalColdStartStorm",  # queue_wait: one sample per request held for a cold start
         "expr": 'sum by (function) (increase(shoal_cold_start_seconds_count{phase="queue_wait"}[5m])) > 100',
         "for": "5m", "labels": {"severity": "warning"},
         "annotations": {"summary": "{{ $labels.function }}: more than 100 requests in 5 minutes waited for a "
                                    "replica to start",
                         "description": "Requests keep arriving at zero replicas. Raise min_replicas or "
                                        "idle_to_zero_s, or look at shoal events for the decisions."}},
        {"alert": "ShoalActivatorBacklog", "expr": "max by (function) (shoal_activator_queue_depth) > 50",
         "for": "2m", "labels": {"severity": "warning"},
         "annotations": {"summary": "{{ $labels.function }} holds {{ $value }} requests at the activator",
                         "description": "Requests wait for replicas that do not come: check that it can be placed."}},
    ]
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "shoal", "namespace": cluster.namespace, "labels": labels("monitoring")},
            "spec": {"groups": [{"name": "shoal.slo", "rules": rules}]}}


def _panel(pid: int, title: str, exprs: list[tuple[str, str]], unit: str, x: int, y: int, kind: str = "timeseries"
           ) -> dict[str, Any]:
    return {"id": pid, "type": kind, "title": title, "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(65 + i), "expr": e, "legendFormat": legend} for i, (e, legend) in
                        enumerate(exprs)]}


def dashboard() -> dict[str, Any]:
    panels = [
        _panel(1, "Requests per second by status", [(
            'sum by (function, code) (rate(shoal_gateway_requests_total{function=~"$function"}[1m]))',
            "{{function}} {{code}}")], "reqps", 0, 0),
        _panel(2, "p95 latency at the gateway", [(
            'histogram_quantile(0.95, sum by (function, le) '
            '(rate(shoal_gateway_request_duration_seconds_bucket{function=~"$function"}[1m])))', "{{function}} p95")],
            "s", 12, 0),
        _panel(3, "Replicas by state", [(
            'sum by (function, state) (shoal_function_replicas{function=~"$function"})', "{{function}} {{state}}")],
            "short", 0, 8),
        _panel(4, "Duty cycle per replica (busy fraction of its slice)", [(
            'rate(shoal_replica_busy_seconds_total{function=~"$function"}[1m])', "{{function}} {{pod}}")],
            "percentunit", 12, 8),
        _panel(5, "Cold starts by phase (p95)", [(
            'histogram_quantile(0.95, sum by (function, phase, le) '
            '(rate(shoal_cold_start_seconds_bucket{function=~"$function"}[5m])))', "{{function}} {{phase}}")],
            "s", 0, 16),
        _panel(6, "Requests held at the activator", [(
            'sum by (function) (shoal_activator_queue_depth{function=~"$function"})', "{{function}}")],
            "short", 12, 16),
    ]
    return {
        "title": "Shoal", "uid": "shoal-overview", "schemaVersion": 39, "version": 1, "editable": True,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "10s", "tags": ["shoal"],
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "function", "type": "query", "label": "function", "multi": True, "includeAll": True,
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": "label_values(shoal_gateway_requests_total, function)", "refresh": 2},
        ]},
        "panels": panels,
    }


def grafana_dashboard(cluster) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "shoal-dashboard", "namespace": cluster.namespace,
                         "labels": {**labels("monitoring"), "grafana_dashboard": "1"}},
            "data": {"shoal.json": json.dumps(dashboard(), indent=1, sort_keys=True)}}
