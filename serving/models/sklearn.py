"""scikit-learn and xgboost (sklearn API) estimators saved with joblib or pickle. Unpickling runs
code, so these load only with `trust=True`, refused before the file is opened. Tensors follow
KServe's sklearn server: input `input-0` [-1, n_features], output `output-0` (predict), plus
`predict_proba` for classifiers.
"""

from __future__ import annotations

import numpy as np

from serving.models.base import LoadError, LoadOptions, Model
from serving.protocol.datatypes import v2_datatype
from serving.protocol.types import TensorSpec


class UntrustedArtifact(LoadError):
    pass


class SklearnModel(Model):
    platform = "sklearn"
    v1_output = "output-0"

    def __init__(self, name: str, path: str, options: LoadOptions):
        super().__init__(name, path, options)
        self.estimator = None

    def load(self) -> None:
        if not self.options.trust:
            raise UntrustedArtifact(
                f"{self.path} is a pickle (joblib/pickle): loading it runs code from the file; "
                "refused without --trust"
            )
        import joblib

        try:
            self.estimator = joblib.load(self.path)
        except Exception as exc:
            raise LoadError(f"{self.path} could not be unpickled: {exc}") from None
        if not hasattr(self.estimator, "predict"):
            raise LoadError(f"{self.path} holds a {type(self.estimator).__name__}, which has no predict()")
        n = getattr(self.estimator, "n_features_in_", None)
        self.inputs = (TensorSpec("input-0", "FP64", (-1, int(n) if n else -1)),)
        label_type = _label_datatype(self.estimator)
        outputs = [TensorSpec("output-0", label_type, (-1,))]
        if hasattr(self.estimator, "predict_proba"):
            classes = len(getattr(self.estimator, "classes_", ())) or -1
            outputs.append(TensorSpec("predict_proba", "FP64", (-1, classes)))
        self.outputs = tuple(outputs)
        self.batchable = True
        self.platform = "xgboost" if type(self.estimator).__module__.startswith("xgboost") else "sklearn"

    def predict(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["input-0"]
        out = {"output-0": np.asarray(self.estimator.predict(x))}
        if len(self.outputs) > 1:
            out["predict_proba"] = np.asarray(self.estimator.predict_proba(x), dtype=np.float64)
        return out


def _label_datatype(estimator) -> str:
    classes = getattr(estimator, "classes_", None)
    if classes is not None:
        try:
            return v2_datatype(np.asarray(classes).dtype)
        except ValueError:
            return "BYTES"
    return "FP64"
