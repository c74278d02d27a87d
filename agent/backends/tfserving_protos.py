"""TF Serving's wire format: the generated proto and gRPC modules
(``agent.backends.tfserving_pb``: upstream's names and numbers, no TensorFlow), and
numpy arrays (OIP datatypes) ⇄ ``TensorProto``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from agent.backends.base import DATATYPES, BackendError, InvalidInput

_INSTALL_HINT = "pip install 'edgeagent[tfserving]'"


class Protos:
    """The generated modules the backend uses, by the short names of upstream's files
    (several are one module here)."""

    def __init__(self) -> None:
        from agent.backends.tfserving_pb import (tensorflow_pb2, tensorflow_serving_pb2,
                                                 tensorflow_serving_pb2_grpc)

        serving, grpc_services = tensorflow_serving_pb2, tensorflow_serving_pb2_grpc
        self.predict = self.metadata = self.status = self.management = serving
        self.server_config = serving
        self.model_service = self.prediction_service = grpc_services
        self.tensor = self.types = self.shape = tensorflow_pb2
        t = self.types
        #: TF DataType → OIP datatype, for the types the Open Inference Protocol has.
        self.oip_of = {
            t.DT_BOOL: "BOOL", t.DT_UINT8: "UINT8", t.DT_UINT16: "UINT16",
            t.DT_UINT32: "UINT32", t.DT_UINT64: "UINT64", t.DT_INT8: "INT8",
            t.DT_INT16: "INT16", t.DT_INT32: "INT32", t.DT_INT64: "INT64",
            t.DT_HALF: "FP16", t.DT_FLOAT: "FP32", t.DT_DOUBLE: "FP64", t.DT_STRING: "BYTES",
        }
        self.tf_of = {v: k for k, v in self.oip_of.items()}


@functools.cache
def _load() -> Protos:
    return Protos()


def protos() -> Protos:
    """The generated modules (imported once); ``BackendError`` if grpcio is missing."""
    try:
        import grpc  # noqa: F401 - fail here, with the hint, rather than at first call

        return _load()
    except ImportError as exc:
        raise BackendError(f"backend tfserving needs grpcio ({exc.name or exc} is "
                           f"missing): {_INSTALL_HINT}") from None


def oip_datatype(p: Protos, dtype: int) -> str:
    """The OIP name of TF DataType ``dtype``; ``BackendError`` for types OIP lacks."""
    try:
        return p.oip_of[dtype]
    except KeyError:
        raise BackendError(f"TF datatype {p.types.DataType.Name(dtype)} has no Open "
                           "Inference Protocol equivalent") from None


def to_tensor_proto(p: Protos, name: str, array: np.ndarray) -> Any:
    """``array`` as a TensorProto: numbers as little-endian ``tensor_content``, BYTES
    (object arrays of bytes or str) as ``string_val``."""
    proto = p.tensor.TensorProto()
    proto.tensor_shape.dim.extend(p.shape.TensorShapeProto.Dim(size=d) for d in array.shape)
    if array.dtype.kind in "OSU":
        proto.dtype = p.types.DT_STRING
        try:
            proto.string_val.extend(v if isinstance(v, bytes) else str(v).encode()
                                    for v in array.reshape(-1))
        except UnicodeEncodeError:
            raise InvalidInput(f"input {name!r}: BYTES elements must be bytes or text") from None
        return proto
    for oip, dtype in DATATYPES.items():
        if array.dtype == dtype and oip in p.tf_of:
            proto.dtype = p.tf_of[oip]
            proto.tensor_content = np.ascontiguousarray(
                array, dtype=dtype.newbyteorder("<")).tobytes()
            return proto
    raise InvalidInput(f"input {name!r}: dtype {array.dtype} cannot be sent to TF Serving")


_VALUE_FIELDS = {"FP32": "float_val", "FP64": "double_val", "INT32": "int_val",
                 "INT16": "int_val", "INT8": "int_val", "UINT8": "int_val",
                 "UINT16": "int_val", "INT64": "int64_val", "UINT32": "uint32_val",
                 "UINT64": "uint64_val", "BOOL": "bool_val", "FP16": "half_val"}


def from_tensor_proto(p: Protos, name: str, proto: Any) -> np.ndarray:
    """The numpy array a TensorProto holds (``tensor_content`` or the typed ``*_val``
    field, where one value stands for all, as TensorFlow reads it)."""
    oip = oip_datatype(p, proto.dtype)
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    count = int(np.prod(shape, dtype=np.int64))
    if oip == "BYTES":
        values = list(proto.string_val)
        if len(values) == 1 and count > 1:
            values *= count
        array = np.empty(len(values), dtype=object)
        array[:] = values
    else:
        dtype = DATATYPES[oip]
        if proto.tensor_content:
            array = np.frombuffer(proto.tensor_content, dtype=dtype.newbyteorder("<"))
            array = array.astype(dtype, copy=False)
        else:
            raw = getattr(proto, _VALUE_FIELDS[oip])
            if oip == "FP16":  # half_val holds the 16-bit patterns
                array = np.asarray(raw, dtype=np.uint16).view(np.float16)
            else:
                array = np.asarray(raw, dtype=dtype)
            if array.size == 1 and count > 1:
                array = np.full(count, array[0], dtype=dtype)
            elif array.size == 0 and count > 0:
                array = np.zeros(count, dtype=dtype)
    if array.size != count:
        raise BackendError(f"output {name!r}: TF Serving sent {array.size} values for "
                           f"shape {list(shape)}")
    return array.reshape(shape)
