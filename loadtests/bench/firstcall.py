"""Benchmark: a replica's first request with and without the warm-up at load (Model.warm_up). Each
model is loaded in fresh processes, as a replica loads it, on the device given; in one process the
loader's warm-up runs before the timed calls, in the other it does not, alternating over rounds.
It prints, per model, the load, the warm-up, the first three calls and the median of the next
ones, and the ratio of the first call without the warm-up to the first with it. The models: the
digits ONNX classifier (on the CPU provider here), and where torch is installed a TorchScript
scorer (64 -> 10) without a sidecar (only the device is warmed: TorchScript declares no shapes),
the same with a sidecar declaring X, and on a GPU a TorchScript of 16 matrix products of
2,048 x 2,048 with one. Results: docs/gpu.md (on a GPU) and docs/benchmarks.md.

    python -m loadtests.bench.firstcall [--device gpu:0|cpu] [--rounds 3] [--calls 8] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

_SIDECAR = "inputs:\n  - {name: X, datatype: FP32, shape: [-1, 64]}\noutputs:\n  - {name: OUTPUT__0, datatype: FP32, shape: [-1, %d]}\n"


def scorer_module(torch):
    """A TorchScript module with a named input, X: 64 pixels -> 10 probabilities (seed 0). The GPU
    tests (tests/gpu) serve it too."""

    class Scorer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(64, 10)

        def forward(self, X):
            return torch.softmax(self.linear(X), dim=1)

    torch.manual_seed(0)
    return torch.jit.script(Scorer().eval())


def matmuls_module(torch):
    """A TorchScript module that spends milliseconds of a GPU's kernels a call: 16 products of
    2,048 x 2,048 float32 matrices (17 GFLOP each), its answer a function of X (seed 0). The GPU
    tests serve it too."""

    class Matmuls(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(2048, 2048) / 45.0)

        def forward(self, X):
            h = self.w
            for _ in range(16):
                h = torch.tanh(h @ self.w)
            return X * h.mean()

    torch.manual_seed(0)
    return torch.jit.script(Matmuls().eval())


def build(folder: Path, device: str) -> dict[str, Path]:
    """The models this bench loads, written under `folder` (the matrix products on a GPU only:
    on a CPU each call takes seconds)."""
    from functions.examples.digits import build_digits_onnx

    models = {"digits.onnx": build_digits_onnx(folder / "digits.onnx")}
    try:
        import torch
    except ImportError:
        print("firstcall: no torch here: the TorchScript models are skipped")
        return models

    chosen = [("scorer.pt", scorer_module(torch), 10, False), ("scorer-declared.pt", scorer_module(torch), 10, True)]
    if device.startswith("gpu"):
        chosen.append(("matmuls-declared.pt", matmuls_module(torch), 64, True))
    for name, module, width, sidecar in chosen:
        path = folder / name
        module.save(str(path))
        if sidecar:
            Path(str(path) + ".yaml").write_text(_SIDECAR % width)
        models[name] = path
    return models


def one(path: str, device: str, warm: bool, calls: int) -> dict:
    """In this process: load the model as a replica does, warm it up or not, and time `calls`
    calls on a batch of one real row."""
    from serving.models import create_model
    from serving.models.base import LoadOptions

    model = create_model(path, "bench", None, LoadOptions(device=device))
    t = time.perf_counter()
    model.load()
    load_s = time.perf_counter() - t
    done, warm_s = "not run", 0.0
    if warm:
        t = time.perf_counter()
        done = model.warm_up()
        warm_s = time.perf_counter() - t
    x = {model.inputs[0].name: np.random.default_rng(0).random((1, 64), dtype=np.float32)}
    took = []
    for _ in range(calls):
        t = time.perf_counter()
        model.predict(x)
        took.append(time.perf_counter() - t)
    return {"load_s": load_s, "warm_s": warm_s, "warm_up": done, "calls_s": took}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench.firstcall", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu or gpu:N (default cpu)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=8, help="timed calls per process (at least 4)")
    p.add_argument("--json", default=None)
    p.add_argument("--one", nargs=3, metavar=("PATH", "WARM", "CALLS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one[0], args.device, args.one[1] == "1", int(args.one[2]))))
        return 0
    if args.calls < 4 or args.rounds < 1:
        p.error("--calls must be at least 4 and --rounds at least 1")
    results: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        models = build(Path(tmp), args.device)
        for _ in range(args.rounds):
            for name, path in models.items():
                for warm in (False, True):
                    out = subprocess.run([sys.executable, "-m", "loadtests.bench.firstcall", "--device", args.device,
                                          "--one", str(path), "1" if warm else "0", str(args.calls)],
                                         capture_output=True, text=True, cwd=ROOT, timeout=300)
                    if out.returncode != 0:
                        print(out.stderr[-2000:], file=sys.stderr)
                        return 1
                    run = json.loads(out.stdout.strip().splitlines()[-1])
                    results.setdefault(name, {}).setdefault("warm" if warm else "cold", []).append(run)
    print(f"first calls on {args.device}, {args.rounds} round(s), fresh processes, medians over rounds (ms):")
    for name, by in results.items():
        line = [f"{name}:"]
        for kind in ("cold", "warm"):
            def med(of, runs=by[kind]) -> float:
                """The median over the rounds, in ms."""
                return 1000 * statistics.median(of(r) for r in runs)

            line.append(f"{'without' if kind == 'cold' else 'with'} the warm-up: load {med(lambda r: r['load_s']):.1f}, "
                        f"warm-up {med(lambda r: r['warm_s']):.1f}, calls 1-3 {med(lambda r: r['calls_s'][0]):.2f} / "
                        f"{med(lambda r: r['calls_s'][1]):.2f} / {med(lambda r: r['calls_s'][2]):.2f}, then "
                        f"{med(lambda r: statistics.median(r['calls_s'][3:])):.2f};")
        first = {k: statistics.median(r["calls_s"][0] for r in by[k]) for k in ("cold", "warm")}
        line.append(f"first call without / with: {first['cold'] / first['warm']:.1f}x ({by['warm'][0]['warm_up']})")
        print(" ".join(line))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
