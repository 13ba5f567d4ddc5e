"""Peer for benchmarks: an ONNX model behind KServe's own ModelServer, written the way a KServe
user writes a custom predictor (a kserve.Model that wraps onnxruntime). KServe's REST server
binds 0.0.0.0 unconditionally (../shared/PACKAGES.md), so this narrows its uvicorn config to
127.0.0.1 and turns gRPC off; nothing else of KServe is changed.

    python -m loadtests.peers.kserve_onnx MODEL.onnx --name digits --http_port 8085
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--name", default="digits")
    p.add_argument("--http_port", type=int, default=8085)
    args = p.parse_args()

    import kserve
    import kserve.protocol.rest.server as rest_server
    import onnxruntime as ort
    import uvicorn
    from kserve.utils.utils import generate_uuid

    class LoopbackConfig(uvicorn.Config):
        def __init__(self, *a, **kw):
            kw["host"] = "127.0.0.1"
            super().__init__(*a, **kw)

    rest_server.uvicorn.Config = LoopbackConfig  # type: ignore[attr-defined]

    class OnnxModel(kserve.Model):
        def __init__(self, name: str, path: str):
            super().__init__(name)
            self.path = path
            self.session = None

        def load(self) -> bool:
            so = ort.SessionOptions()
            so.intra_op_num_threads = 1
            self.session = ort.InferenceSession(self.path, so, providers=["CPUExecutionProvider"])
            self.ready = True
            return True

        def predict(self, payload, headers=None):
            x = payload.inputs[0].as_numpy().astype(np.float32)
            names = [o.name for o in self.session.get_outputs()]
            results = self.session.run(names, {self.session.get_inputs()[0].name: x})
            outputs = []
            for name, arr in zip(names, results):
                out = kserve.InferOutput(name=name, shape=list(arr.shape), datatype="INT64" if arr.dtype == np.int64 else "FP32")
                out.set_data_from_numpy(arr, binary_data=False)
                outputs.append(out)
            # KServe's REST layer rejects a response without an id (pydantic), so
            # generate one as KServe's own examples do when the request has none.
            response_id = payload.id or generate_uuid()
            return kserve.InferResponse(model_name=self.name, infer_outputs=outputs, response_id=response_id)

    model = OnnxModel(args.name, args.model)
    model.load()
    sys.argv = [sys.argv[0], "--http_port", str(args.http_port), "--enable_grpc", "false"]
    kserve.ModelServer(http_port=args.http_port, enable_grpc=False).start([model])


if __name__ == "__main__":
    main()
