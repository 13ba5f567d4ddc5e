"""Shoal on Kubernetes: the controller and gateway roles, the API plane, the backend and the manifests."""
