"""V2 datatypes and their numpy dtypes (every V2 datatype that numpy has).

BF16 has no numpy dtype and is refused with a message that says so.
"""

from __future__ import annotations

import numpy as np

V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}

NUMPY_TO_V2: dict[np.dtype, str] = {dt: name for name, dt in V2_TO_NUMPY.items()}

INTEGER_TYPES = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"})
FLOAT_TYPES = frozenset({"FP16", "FP32", "FP64"})

# ONNX Runtime reports types as "tensor(float)".
ONNX_TO_V2: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of a V2 datatype; ValueError names the value and the choices."""
    try:
        return V2_TO_NUMPY[datatype]
    except (KeyError, TypeError):
        if datatype == "BF16":
            raise ValueError("datatype 'BF16' is not supported (numpy has no bfloat16); send FP32 or FP16") from None
        raise ValueError(
            f"unknown datatype {datatype!r}; expected one of {', '.join(V2_TO_NUMPY)}"
        ) from None


def v2_datatype(dtype: np.dtype) -> str:
    """The V2 datatype of a numpy dtype (strings and bytes are BYTES)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OSU":
        return "BYTES"
    try:
        return NUMPY_TO_V2[dtype.newbyteorder("=")]
    except KeyError:
        raise ValueError(f"numpy dtype {dtype} has no V2 datatype") from None
