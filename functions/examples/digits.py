"""The example model: logistic regression on scikit-learn's bundled digits, as ONNX.

No download: `load_digits` ships with scikit-learn. The model is about 4 KB with
input `X` [-1, 64] FP32 and outputs `label` [-1] INT64 and `probabilities` [-1, 10] FP32.

    python -m functions.examples.digits OUT.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def digits_data() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.data.astype(np.float32), digits.target.astype(np.int64)


def train_digits():
    from sklearn.linear_model import LogisticRegression

    x, y = digits_data()
    return LogisticRegression(max_iter=2000).fit(x, y)


def build_digits_onnx(out: str | Path) -> Path:
    """Train and write the ONNX model (zipmap off so probabilities are a plain tensor)."""
    from skl2onnx import to_onnx

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model = train_digits()
    x, _ = digits_data()
    onx = to_onnx(model, x[:1], options={"zipmap": False}, target_opset=17)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(onx.SerializeToString())
    tmp.replace(out)
    return out


if __name__ == "__main__":
    print(build_digits_onnx(sys.argv[1] if len(sys.argv) > 1 else "digits.onnx"))
