"""Shoal on Kubernetes as manifests: GPU sharing modes (gpus.py), the objects (render.py),
monitoring (monitoring.py) and KServe InferenceServices (kserve.py)."""
