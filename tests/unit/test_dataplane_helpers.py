"""The DataPlane's pure helpers: request validation, batch merge and split, V1 conversion, and
which model errors mean the device is lost."""

from __future__ import annotations

import numpy as np
import pytest

from serving.dataplane import merge_inputs, shape_matches, split_outputs, v1_predictions, v1_to_request, validate_request
from serving.executor import device_lost
from serving.models.base import LoadOptions, Model
from serving.protocol.errors import InvalidInput, ModelError
from serving.protocol.types import InferRequest, RequestedOutput, Tensor, TensorSpec


class FakeModel(Model):
    def __init__(self, inputs, outputs=(), batchable=True):
        super().__init__("m", "/dev/null", LoadOptions())
        self.inputs, self.outputs, self.batchable = tuple(inputs), tuple(outputs), batchable

    def load(self):
        pass

    def predict(self, inputs):
        return inputs


X = TensorSpec("x", "FP32", (-1, 4))
Y = TensorSpec("y", "INT64", (-1,))


def t(name, arr, datatype="FP32"):
    arr = np.asarray(arr)
    return Tensor(name, datatype, arr.shape, arr)


@pytest.mark.parametrize(
    "shape,declared,ok",
    [((2, 4), (-1, 4), True), ((2, 3), (-1, 4), False), ((4,), (-1, 4), False), ((1, 2, 3), (-1, -1, 3), True)],
    ids=["free-batch", "wrong-width", "wrong-rank", "two-free"],
)
def test_shape_matches(shape, declared, ok):
    assert shape_matches(shape, declared) is ok


def test_validate_returns_signature_and_rows():
    model = FakeModel([X], [Y])
    request = InferRequest(inputs=[t("x", np.zeros((3, 4), np.float32))])
    signature, rows = validate_request(request, model)
    assert rows == 3 and signature == (("x", "FP32", (4,)),)


@pytest.mark.parametrize(
    "inputs,outputs,fragment",
    [
        ([t("x", np.zeros((1, 4))), t("x", np.zeros((1, 4)))], None, "must be unique"),
        ([t("z", np.zeros((1, 4)))], None, "unknown input 'z'"),
        ([t("x", np.zeros((1, 4)), "FP64")], None, "has datatype FP64 but model 'm' expects FP32"),
        ([t("x", np.zeros((1, 5)))], None, "has shape [1, 5] but model 'm' expects [-1, 4]"),
        ([], None, "missing input(s) 'x' (FP32 [-1, 4])"),
        ([t("x", np.zeros((1, 4)))], [RequestedOutput("q")], "unknown output 'q'"),
    ],
    ids=["duplicate", "unknown", "datatype", "shape", "missing", "unknown-output"],
)
def test_validate_rejects(inputs, outputs, fragment):
    with pytest.raises(InvalidInput) as err:
        validate_request(InferRequest(inputs=inputs, outputs=outputs), FakeModel([X], [Y]))
    assert fragment in err.value.message


def test_inputs_must_agree_on_batch_dimension():
    model = FakeModel([X, TensorSpec("w", "FP32", (-1,))])
    request = InferRequest(inputs=[t("x", np.zeros((2, 4))), t("w", np.zeros(3))])
    with pytest.raises(InvalidInput, match="disagree on the batch dimension"):
        validate_request(request, model)


def test_merge_then_split_gives_each_request_its_rows():
    a = InferRequest(inputs=[t("x", np.full((1, 4), 1.0))])
    b = InferRequest(inputs=[t("x", np.full((2, 4), 2.0))])
    merged = merge_inputs([a, b])
    assert merged["x"].shape == (3, 4)
    parts = split_outputs({"y": merged["x"][:, 0]}, [1, 2])
    assert parts[0]["y"].tolist() == [1.0] and parts[1]["y"].tolist() == [2.0, 2.0]


def test_split_rejects_outputs_without_batch_rows():
    with pytest.raises(ModelError, match="not 3 rows"):
        split_outputs({"y": np.zeros(2)}, [1, 2])


def test_v1_single_input_instances_are_rows():
    request = v1_to_request({"instances": [[1, 2, 3, 4], [5, 6, 7, 8]]}, FakeModel([X]))
    assert request.inputs[0].shape == (2, 4) and request.inputs[0].data.dtype == np.float32


def test_v1_multi_input_instances_are_objects():
    model = FakeModel([X, TensorSpec("w", "INT64", (-1,))])
    request = v1_to_request({"instances": [{"x": [1, 2, 3, 4], "w": 7}]}, model)
    assert [i.shape for i in request.inputs] == [(1, 4), (1,)]
    with pytest.raises(InvalidInput, match="each instance must be an object"):
        v1_to_request({"instances": [[1, 2, 3, 4]]}, model)


def test_v1_predictions_one_object_per_row_for_several_outputs():
    outputs = [t("label", np.array([3, 4]), "INT64"), t("p", np.array([[0.1], [0.2]]))]
    preds = v1_predictions(outputs, FakeModel([X]))
    assert [p["label"] for p in preds] == [3, 4]


@pytest.mark.parametrize("error, lost", [
    (RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
                  "asynchronously reported"), "CUDA error: an illegal memory access was encountered"),
    (RuntimeError("CUDA error: device-side assert triggered"), "CUDA error: device-side assert triggered"),
    (RuntimeError("CUDA error: unspecified launch failure"), "CUDA error: unspecified launch failure"),
    (ModelError("model 'f' raised AcceleratorError: CUDA error: misaligned address"),
     "model 'f' raised AcceleratorError: CUDA error: misaligned address"),
    # recoverable, or not the device's: the replica keeps serving
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), None),
    (ValueError("an illegal memory access was encountered"), None),  # no CUDA in it: a model's own words
    (RuntimeError("CUDA error: invalid argument"), None),
    (KeyError("x"), None),
], ids=["illegal-address", "assert", "launch-failure", "wrapped", "oom", "not-cuda", "invalid-argument", "keyerror"])
def test_a_sticky_cuda_error_is_a_lost_device(error, lost):
    assert device_lost(error) == lost
