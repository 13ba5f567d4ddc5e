"""The labels every Shoal object carries and the selectors that match them (shared by render.py and
monitoring.py, which must agree on them)."""

APP = "app.kubernetes.io/name"
PART = "app.kubernetes.io/component"
MANAGED = "app.kubernetes.io/managed-by"
FUNCTION_LABEL = "shoal.dev/function"


def labels(component: str, **extra: str) -> dict[str, str]:
    return {APP: "shoal", PART: component, MANAGED: "shoal", **extra}


def selector(component: str, **extra: str) -> dict[str, str]:
    return {APP: "shoal", PART: component, **extra}
