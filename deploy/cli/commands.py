"""The client commands of `shoal`: deploy, ls, rm, invoke, events, top, export.

Each reaches the control plane at --url / SHOAL_URL with --token / SHOAL_TOKEN,
else the token file `shoal up` wrote in --state-dir.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path

from deploy.cli.client import Shoal, ShoalError


def _common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--url", help="control plane (default: SHOAL_URL or http://127.0.0.1:8080)")
    p.add_argument("--token", help="bearer token (default: SHOAL_TOKEN or STATE_DIR/token)")
    p.add_argument("--state-dir", help="where `shoal up` keeps its token (default .shoal)")
    return p


def _client(args) -> Shoal:
    return Shoal(args.url, args.token, args.state_dir)


def _run(fn, args) -> int:
    try:
        with _client(args) as client:
            return fn(client, args) or 0
    except ShoalError as exc:
        print(f"shoal: {exc.message}", file=sys.stderr)
        return 1


# ---------------------------------------------------------------------- deploy


def deploy(argv: list[str]) -> int:
    p = _common(argparse.ArgumentParser(prog="shoal deploy", description="Deploy a model artifact as a function."))
    p.add_argument("artifact", help=".onnx .pt .joblib/.pkl .py .ipynb function.yaml or a profile .yaml")
    p.add_argument("--name")
    p.add_argument("--slice", default="1/4", help="share of a device, e.g. 1/4 or 1/2:4096 (MiB)")
    p.add_argument("--min", type=int, dest="min_replicas")
    p.add_argument("--max", type=int, dest="max_replicas")
    p.add_argument("--initial", type=int, default=0, dest="initial_replicas",
                   help="replicas each revision starts at once and holds until ready, the autoscaler deciding "
                        "from then on (Knative's initial-scale, whose default is 1; here 0: the first request "
                        "starts one)")
    p.add_argument("--slo-ms", type=float, default=100.0)
    p.add_argument("--batch", type=int, default=1, help="max batch size (1: no batching; batching is opt-in)")
    p.add_argument("--batch-delay-ms", type=float, default=0.0)
    from autoscaler.policy import DEFAULT_CONFIG as policy  # the keep-alive's bounds, as the controller runs them

    p.add_argument("--idle-to-zero-s", type=float, default=60.0,
                   help="idle seconds before scale to zero; where a cold start would miss the SLO the "
                        "keep-alive prices its misses and may keep it longer (up to "
                        f"{policy.few_gaps_keep_x:g} x this while few idle gaps are known, "
                        f"{policy.keep_alive_max_s:g} s at most, or --keep-alive-max-s)")
    p.add_argument("--keep-alive-max-s", type=float,
                   help="the most an idle function is kept past its last request, whatever a cold start "
                        f"would cost (default: the platform's {policy.keep_alive_max_s:g} s); set it to "
                        "--idle-to-zero-s to always go then, cold starts accepted")
    p.add_argument("--target-concurrency", type=float, default=4.0)
    p.add_argument("--timeout-s", type=float, help="how long one request may take in the model before a 504 "
                   "(default 60); a replica stuck in the model past it is replaced")
    p.add_argument("--loader")
    p.add_argument("--trust", action="store_true", help="allow pickles, which run code when loaded")
    p.add_argument("--wait", action="store_true", help="start the first replica and wait until it serves")
    args = p.parse_args(argv)
    if not Path(args.artifact).is_file():
        print(f"shoal deploy: {args.artifact}: no such file", file=sys.stderr)
        return 2

    def run(client: Shoal, args) -> int:
        function = client.deploy(
            args.artifact, args.name, slice=args.slice, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
            slo_ms=args.slo_ms, batch=args.batch, batch_delay_ms=args.batch_delay_ms, trust=args.trust,
            loader=args.loader, idle_to_zero_s=args.idle_to_zero_s, target_concurrency=args.target_concurrency,
            wait=args.wait, progress=_progress, timeout_s=args.timeout_s, initial_replicas=args.initial_replicas,
            keep_alive_max_s=args.keep_alive_max_s,
        )
        name = function["name"]
        print(f"deployed {name} revision {function['revision']}  {client.url}{function['endpoints']['v2']}")
        if "first_ready_s" in function:
            print(f"first replica answered in {function['first_ready_s']:.3f} s")
        return 0

    return _run(run, args)


def _progress(stage: str, done: int, total: int) -> None:
    if not sys.stderr.isatty():
        return
    if stage == "upload":
        width = 30
        filled = int(width * done / max(total, 1))
        sys.stderr.write(f"\ruploading [{'#' * filled}{'.' * (width - filled)}] {done / 2**20:.1f}/{total / 2**20:.1f} MiB")
        if done >= total:
            sys.stderr.write("\n")
    else:
        sys.stderr.write("starting the first replica...\n" if done == 0 else "")
    sys.stderr.flush()


# ---------------------------------------------------------------------- ls, rm, export, events


def ls(argv: list[str]) -> int:
    args = _common(argparse.ArgumentParser(prog="shoal ls")).parse_args(argv)

    def run(client: Shoal, args) -> int:
        status = client.status()["functions"]
        rows = [("NAME", "REV", "SLICE", "READY", "MIN", "INITIAL", "MAX", "SLO", "ARTIFACT")]
        for f in client.functions():
            s, scaling = status.get(f["name"], {}), f["scaling"]
            rows.append((f["name"], str(f["revision"]), f["slice"], str(s.get("ready", 0)),
                         str(scaling["min_replicas"]), str(scaling.get("initial_replicas", 0)),
                         str(scaling["max_replicas"]), f"{scaling['slo_p95_ms']:g}ms",
                         f["artifact"].rsplit("/", 1)[-1]))
        print(_table(rows))
        return 0

    return _run(run, args)


def rm(argv: list[str]) -> int:
    p = _common(argparse.ArgumentParser(prog="shoal rm"))
    p.add_argument("name")
    args = p.parse_args(argv)

    def run(client: Shoal, args) -> int:
        client.delete(args.name)
        print(f"removed {args.name}")
        return 0

    return _run(run, args)


def export(argv: list[str]) -> int:
    p = _common(argparse.ArgumentParser(prog="shoal export", description="Write a Nuclio function.yaml."))
    p.add_argument("name")
    p.add_argument("-o", "--output", help="file to write (default: stdout)")
    args = p.parse_args(argv)

    def run(client: Shoal, args) -> int:
        text = client.export(args.name)
        if args.output:
            Path(args.output).write_text(text)
            print(f"wrote {args.output}")
        else:
            sys.stdout.write(text)
        return 0

    return _run(run, args)


def events(argv: list[str]) -> int:
    p = _common(argparse.ArgumentParser(prog="shoal events"))
    p.add_argument("function", nargs="?")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("-f", "--follow", action="store_true")
    args = p.parse_args(argv)

    def run(client: Shoal, args) -> int:
        last = 0
        while True:
            for e in client.events(args.function, after=last, limit=args.limit):
                stamp = datetime.fromtimestamp(e["at"]).strftime("%H:%M:%S.%f")[:-3]
                print(f"{stamp}  {e['kind']:<16} {e['function'] or '-':<16} {e['message']}")
                last = e["id"]
            if not args.follow:
                return 0
            time.sleep(1)

    return _run(run, args)


# ---------------------------------------------------------------------- invoke, top


def invoke(argv: list[str]) -> int:
    p = _common(argparse.ArgumentParser(prog="shoal invoke", description="Send one request through the gateway."))
    p.add_argument("name")
    body = p.add_mutually_exclusive_group(required=True)
    body.add_argument("--data", help="a V2 body ({\"inputs\": ...}) or a V1 body ({\"instances\": ...}), or @FILE")
    body.add_argument("--json", dest="event", metavar="JSON",
                      help="any JSON, or @FILE, sent as it is: a Python handler gets it as event.body (Nuclio's form)")
    args = p.parse_args(argv)
    flag, given = ("--data", args.data) if args.data is not None else ("--json", args.event)
    text = Path(given[1:]).read_text() if given.startswith("@") else given
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        print(f"shoal invoke: {flag} is not JSON: {exc}", file=sys.stderr)
        return 2
    if flag == "--data" and not (isinstance(body, dict) and {"inputs", "instances"} & body.keys()):
        print("shoal invoke: --data is a V2 body with 'inputs' or a V1 body with 'instances'; "
              "send other JSON to a handler (as its event.body) with --json", file=sys.stderr)
        return 2

    def run(client: Shoal, args) -> int:
        response = client.invoke(args.name, body) if flag == "--data" else client.invoke_json(args.name, body)
        cold = response.headers.get("shoal-cold-start")
        if cold:
            print(f"# cold start: {cold}", file=sys.stderr)
        print(_shown(response))
        return 0 if response.status_code == 200 else 1

    return _run(run, args)


def _shown(response) -> str:
    """A response body to print: indented JSON, else its text (a handler may answer text)."""
    try:
        return json.dumps(response.json(), indent=2)
    except ValueError:
        return response.text


def top(argv: list[str]) -> int:
    p = _common(argparse.ArgumentParser(prog="shoal top", description="Live table of functions and replicas."))
    p.add_argument("--once", action="store_true", help="print one table and exit")
    p.add_argument("--interval-s", type=float, default=1.0)
    args = p.parse_args(argv)

    def run(client: Shoal, args) -> int:
        while True:
            table = render_top(client.status())
            if args.once:
                print(table)
                return 0
            sys.stdout.write("\x1b[H\x1b[2J" + table + "\n")
            sys.stdout.flush()
            time.sleep(args.interval_s)

    try:
        return _run(run, args)
    except KeyboardInterrupt:
        return 0


def render_top(status: dict) -> str:
    rows = [("FUNCTION", "REPLICA", "STATE", "DEVICE", "SLICE", "DUTY", "INFLIGHT", "P95", "RPS", "COLD")]
    for name, f in sorted(status["functions"].items()):
        p95 = f"{f['p95_s'] * 1000:.1f}ms" if f.get("p95_s") is not None else "-"
        rps = f"{f.get('rps', 0):.1f}"
        head = (name, f"{f.get('ready', 0)} ready/{f.get('starting', 0)} starting", f.get("reason") or "-", "", f["slice"],
                "", f"{f.get('inflight', 0):g}+{f.get('held', 0)} held", p95, rps, str(f.get("cold_starts", 0)))
        rows.append(head)
        for r in f.get("replicas", []):
            duty = f"{r['duty']:.0%}" if r.get("duty") is not None else "-"
            device = r["device"] + (" (emulated)" if r.get("emulated") else "")
            rows.append(("", r["id"], r["state"], device, r["slice"], duty, f"{r.get('inflight', 0):g}", "", "", ""))
    devices = "  ".join(f"{d['id']}{'*' if d['emulated'] else ''}{' ' + d['sharing'] if d.get('sharing') else ''} "
                        f"{d['allocated']:.0%}" for d in status["devices"])
    sharing = status.get("gpu_sharing") or {"mode": "none"}
    gpus = "" if sharing["mode"] == "none" else f"\nGPU sharing: {sharing['mode']} ({sharing['why']})"
    return _table(rows) + f"\n\ndevices (allocated share; * emulated; a GPU's sharing): {devices}{gpus}"


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
