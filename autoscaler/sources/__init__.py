"""Metrics sources of the control loop: per-replica scrapes (direct.py) and PromQL (promql.py)."""
