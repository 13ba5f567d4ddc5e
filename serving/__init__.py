"""Shoal's data path: the replica runtime and (later) the gateway.

May import `functions` and `autoscaler.metrics`; nothing else of the control plane.
"""

__version__ = "0.1.0"
