"""The few ONNX messages the model zoo writes, encoded straight to protobuf's wire format.

``agent.modelzoo`` builds the demo's models with these on the default install, which has
ONNX Runtime but not the ``onnx`` package. The fields are those of ``onnx.proto``
(proto2: repeated scalars unpacked), written in field-number order as protobuf itself
writes them, so ``onnx.load_model_from_string(b).SerializeToString() == b``
(tests/test_modelzoo.py checks it with the ``onnx`` package).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

#: TensorProto.DataType numbers by numpy dtype (and "string").
ELEM_TYPES = {"float32": 1, "int32": 6, "int64": 7, "string": 8, "bool": 9, "float64": 11}


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _bytes(field: int, value: bytes | str) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _messages(field: int, values: Iterable[bytes]) -> bytes:
    return b"".join(_bytes(field, value) for value in values)


def tensor(name: str, array: np.ndarray) -> bytes:
    """TensorProto: an initializer, its little-endian data in ``raw_data``."""
    array = np.ascontiguousarray(array)
    return (b"".join(_int(1, d) for d in array.shape) + _int(2, ELEM_TYPES[array.dtype.name])
            + _bytes(8, name) + _bytes(9, array.astype(array.dtype.newbyteorder("<")).tobytes()))


def value_info(name: str, elem_type: int, shape: Iterable[int | str]) -> bytes:
    """ValueInfoProto: a graph input or output; a str dimension is symbolic."""
    dims = [_int(1, d) if isinstance(d, int) else _bytes(2, d) for d in shape]
    tensor_type = _int(1, elem_type) + _bytes(2, _messages(1, dims))
    return _bytes(1, name) + _bytes(2, _bytes(1, tensor_type))


def attribute(name: str, value: int) -> bytes:
    """AttributeProto of type INT (the only kind the zoo's operators take)."""
    return _bytes(1, name) + _int(3, value) + _int(20, 2)


def node(op_type: str, inputs: list[str], outputs: list[str], *, name: str = "",
         attributes: Iterable[bytes] = ()) -> bytes:
    """NodeProto in the default domain."""
    return (b"".join(_bytes(1, i) for i in inputs) + b"".join(_bytes(2, o) for o in outputs)
            + (_bytes(3, name) if name else b"") + _bytes(4, op_type)
            + _messages(5, attributes))


def model(*, graph_name: str, nodes: list[bytes], inputs: list[bytes], outputs: list[bytes],
          initializers: Iterable[bytes] = (), ir_version: int, opset: int,
          producer: str) -> bytes:
    """ModelProto: one graph, the default domain's ``opset``."""
    graph = (_messages(1, nodes) + _bytes(2, graph_name) + _messages(5, initializers)
             + _messages(11, inputs) + _messages(12, outputs))
    return (_int(1, ir_version) + _bytes(2, producer) + _bytes(7, graph)
            + _bytes(8, _bytes(1, "") + _int(2, opset)))


__all__ = ["ELEM_TYPES", "attribute", "model", "node", "tensor", "value_info"]
