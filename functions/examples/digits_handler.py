"""A Nuclio-style function: nearest-centroid digit classifier, numpy only.

Runs unchanged on Nuclio (`handler(context, event)`, `init_context(context)`),
and on Shoal. On V1 `event.body` is the JSON body; on V2 it is {input: array}.
"""

import numpy as np

INPUTS = [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]
OUTPUTS = [{"name": "digit", "datatype": "INT64", "shape": [-1]}]


def init_context(context):
    from sklearn.datasets import load_digits

    digits = load_digits()
    centroids = np.stack([digits.data[digits.target == d].mean(axis=0) for d in range(10)])
    setattr(context.user_data, "centroids", centroids.astype(np.float32))
    context.logger.info("digits centroids ready")


def classify(centroids, pixels):
    x = np.asarray(pixels, dtype=np.float32).reshape(-1, 64)
    distances = ((x[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2)
    return distances.argmin(axis=1).astype(np.int64)


def handler(context, event):
    body = event.body
    centroids = context.user_data.centroids
    if isinstance(body, dict) and "instances" in body:
        if not body["instances"]:
            return context.Response(body={"error": "no instances"}, status_code=400, content_type="application/json")
        return {"predictions": classify(centroids, body["instances"]).tolist()}
    return {"digit": classify(centroids, body["pixels"])}
