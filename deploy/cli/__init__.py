"""`shoal ...`: the command line.

Each command lives in its own module and is imported only when it runs, so
`shoal replica` starts without importing the control plane.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("deploy.local.server:main", "run the control plane: gateway, API, controller, local backend"),
    "deploy": ("deploy.cli.commands:deploy", "deploy a model artifact as a function"),
    "ls": ("deploy.cli.commands:ls", "list functions"),
    "rm": ("deploy.cli.commands:rm", "remove a function"),
    "invoke": ("deploy.cli.commands:invoke", "send one request to a function"),
    "events": ("deploy.cli.commands:events", "show scale decisions and other events"),
    "top": ("deploy.cli.commands:top", "live table of functions, replicas, slices, duty cycle"),
    "export": ("deploy.cli.commands:export", "write a function as a Nuclio function.yaml"),
    "replica": ("serving.replica:main", "serve one model artifact on one slice (V2, V1, /metrics)"),
    "loadtest": ("loadtests.runner:main", "run a Locust scenario against a function and write a report"),
    "gateway": ("deploy.cluster.gateway:main", "the gateway on a Kubernetes cluster (EndpointSlices, activator)"),
    "controller": ("deploy.cluster.controller:main", "the controller on a Kubernetes cluster (Lease, PromQL, scale)"),
    "fetch": ("deploy.cli.fetch:main", "download an artifact and check its sha256 (a replica pod's init container)"),
    "k8s": ("deploy.cluster.render:main", "render Shoal's Kubernetes manifests for a GPU sharing mode"),
    "simulate": ("deploy.cli.simulate:main", "compare scaling policies on a trace in the cluster simulator"),
    "demo": ("deploy.cli.demo:main", "serve the example model and call it every way (make demo)"),
    "version": ("deploy.cli:version", "print Shoal's version"),
}


def version(argv: list[str]) -> int:
    from serving import __version__

    print(f"shoal {__version__}")
    return 0


def usage() -> str:
    lines = ["usage: shoal COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "shoal COMMAND --help shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"shoal: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module, _, func = COMMANDS[command][0].partition(":")
    return int(getattr(importlib.import_module(module), func)(rest) or 0)

