"""A KServe custom predictor (kserve.Model), the nearest-centroid digit classifier.

It runs on KServe's own ModelServer (`python digits_kserve.py`) and, unchanged,
as a Shoal function (`shoal replica digits_kserve.py --name digits`).
"""

from typing import Dict, Union

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


class DigitsModel(Model):
    def __init__(self, name: str):
        super().__init__(name)
        self.centroids = None

    def load(self):
        from sklearn.datasets import load_digits

        digits = load_digits()
        self.centroids = np.stack(
            [digits.data[digits.target == d].mean(axis=0) for d in range(10)]
        ).astype(np.float32)
        self.ready = True
        return self.ready

    def _classify(self, x):
        x = np.asarray(x, dtype=np.float32).reshape(-1, 64)
        return ((x[:, None, :] - self.centroids[None]) ** 2).sum(axis=2).argmin(axis=1).astype(np.int64)

    def predict(self, payload: Union[Dict, InferRequest], headers: Dict[str, str] = None):
        if isinstance(payload, InferRequest):
            digits = self._classify(payload.inputs[0].as_numpy())
            out = InferOutput(name="digit", shape=list(digits.shape), datatype="INT64")
            out.set_data_from_numpy(digits, binary_data=False)
            return InferResponse(model_name=self.name, infer_outputs=[out], response_id=payload.id)
        return {"predictions": self._classify(payload["instances"]).tolist()}


if __name__ == "__main__":
    model = DigitsModel("digits")
    model.load()
    ModelServer().start([model])
