"""Faithful re-implementations of peer autoscalers (Knative KPA, Ray Serve), for comparisons."""
