"""Peer for benchmarks: the digits ONNX model on Ray Serve, autoscaling from zero with Ray's default
policy (target 2 ongoing requests, upscale from zero at once), except that the delays before
scaling down are 2 s instead of 600 s, so repeated cold starts fit in a bounded time. It runs in
the venv of `make ray-venv` (Ray Serve 2.60 wants protobuf 7, which KServe cannot take), its
proxy on 127.0.0.1, and prints `ray serve ready STATUS_FILE PORT` once serving; STATUS_FILE
holds the number of running replicas, refreshed every 0.1 s. `--route /v2/models/digits/infer`
puts it where a V2 client posts (shoal loadtest --peer ray).

    .venv-ray/bin/python loadtests/peers/ray_serve_app.py MODEL.onnx [--route /digits] [--max-replicas 1]
"""

import argparse
import os
import socket
import tempfile
import threading
import time

import numpy as np
import onnxruntime as ort
import ray
from ray import serve
from starlette.requests import Request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


AUTOSCALING = {
    "min_replicas": 0, "initial_replicas": 0, "max_replicas": 1, "target_ongoing_requests": 2,
    "downscale_delay_s": 2.0, "downscale_to_zero_delay_s": 2.0,
}


@serve.deployment(autoscaling_config=AUTOSCALING, ray_actor_options={"num_cpus": 0.5})
class Digits:
    def __init__(self, path: str):
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        self.session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    async def __call__(self, request: Request):
        body = await request.json()
        tensor = body["inputs"][0]
        x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        label, probabilities = self.session.run(["label", "probabilities"], {"X": x})
        return {"model_name": "digits", "outputs": [
            {"name": "label", "datatype": "INT64", "shape": list(label.shape), "data": label.tolist()},
            {"name": "probabilities", "datatype": "FP32", "shape": list(probabilities.shape),
             "data": probabilities.reshape(-1).tolist()},
        ]}


def report(status_path: str) -> None:
    while True:
        try:
            deployments = serve.status().applications["default"].deployments
            running = sum(d.replica_states.get("RUNNING", 0) for d in deployments.values())
            with open(status_path + ".tmp", "w") as f:
                f.write(str(running))
            os.replace(status_path + ".tmp", status_path)
        except Exception:
            pass
        time.sleep(0.1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--route", default="/digits")
    p.add_argument("--max-replicas", type=int, default=1)
    args = p.parse_args()
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    config = {**AUTOSCALING, "max_replicas": args.max_replicas}
    serve.run(Digits.options(autoscaling_config=config).bind(args.model), route_prefix=args.route, blocking=False)
    status_path = os.path.join(tempfile.mkdtemp(prefix="ray-serve-"), "replicas")
    threading.Thread(target=report, args=(status_path,), daemon=True).start()
    print(f"ray serve ready {status_path} {port}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
