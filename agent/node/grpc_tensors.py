"""The KServe v2 gRPC messages as tensors: an ``InferRequest`` read into the same
inputs and request fields as the HTTP body (``split_infer_request`` reads
``raw_input_contents`` as views of the received bytes, not protobuf's copies), and the
outputs written back as a ``ModelInferResponse`` (``raw_output_contents``, as Triton
answers). ``agent.node.grpc_v2`` serves the RPCs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from agent.backends.base import DATATYPES, datatype_of
from agent.node.protos import grpc_predict_v2_pb2 as pb
from agent.node.tensors import (NO_LIMITS, BadRequest, Limits, from_bytes_elements,
                                to_bytes_elements)

#: The typed ``InferTensorContents`` field of each datatype (FP16 has none: raw only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def _parameter(value: Any, what: str) -> Any:
    """The Python value of an ``InferParameter`` / ``ModelRepositoryParameter``."""
    choice = value.WhichOneof("parameter_choice")
    if choice is None:
        raise BadRequest(f"{what}: the parameter has no value")
    return getattr(value, choice)


def parameters_of(params: Any, what: str) -> dict[str, Any]:
    """A message's parameters map as plain values."""
    return {key: _parameter(value, f"{what} {key!r}") for key, value in params.items()}


def _shape(tensor: Any) -> tuple[int, ...]:
    shape = tuple(tensor.shape)
    if any(d < 0 for d in shape):
        raise BadRequest(f"input {tensor.name!r}: shape {list(shape)} has a negative "
                         "dimension")
    return shape


def _from_raw(raw: bytes | memoryview, datatype: str, shape: tuple[int, ...],
              name: str) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        return from_bytes_elements(bytes(raw), count, name).reshape(shape)
    dtype = DATATYPES[datatype]
    if len(raw) != count * dtype.itemsize:
        raise BadRequest(f"input {name!r}: {len(raw)} bytes of raw_input_contents, shape "
                         f"{list(shape)} of {datatype} needs {count * dtype.itemsize}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _from_contents(contents: Any, datatype: str, shape: tuple[int, ...],
                   name: str) -> np.ndarray:
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise BadRequest(f"input {name!r}: {datatype} has no typed contents field: send it "
                         "in raw_input_contents")
    others = [f.name for f, _ in contents.ListFields() if f.name != field]
    if others:
        raise BadRequest(f"input {name!r}: a {datatype} input takes contents.{field}, "
                         f"got {', '.join(others)}")
    values = getattr(contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise BadRequest(f"input {name!r}: {len(values)} elements in contents.{field}, "
                         f"shape {list(shape)} needs {count}")
    if datatype == "BYTES":
        return np.array(list(values) + [None], dtype=object)[:-1].reshape(shape)
    dtype = DATATYPES[datatype]
    if dtype.kind in "iu" and dtype.itemsize < 4 and count:
        wide = np.fromiter(values, dtype=np.int64, count=count)
        info = np.iinfo(dtype)
        if wide.min() < info.min or wide.max() > info.max:
            raise BadRequest(f"input {name!r}: values out of range for {datatype}")
        return wide.astype(dtype).reshape(shape)
    # fromiter with a count: no intermediate list, unlike np.array over a repeated field
    return np.fromiter(values, dtype=dtype, count=count).reshape(shape)


#: ``ModelInferRequest.raw_input_contents``'s field number on the wire.
_RAW_FIELD = pb.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    """(the protobuf varint at ``at``, the offset after it)."""
    value = shift = 0
    for end in range(at, min(at + 10, len(data))):
        value |= (data[end] & 0x7F) << shift
        if data[end] < 0x80:
            return value, end + 1
        shift += 7
    raise BadRequest("the message is not a ModelInferRequest (a varint runs past its end)")


def split_infer_request(message: bytes) -> tuple[Any, list[memoryview]]:
    """A serialized ``ModelInferRequest`` as (the message parsed without its
    ``raw_input_contents``, those entries as views of ``message``): protobuf would copy
    each entry twice, once parsing and once more reading the field."""
    view = memoryview(message)
    rest, raw, at = bytearray(), [], 0
    while at < len(view):
        start = at
        key, at = _varint(view, at)
        wire = key & 7
        if wire == 0:
            at = _varint(view, at)[1]
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        elif wire == 2:
            length, at = _varint(view, at)
            if key >> 3 == _RAW_FIELD and at + length <= len(view):
                raw.append(view[at:at + length])
                at += length
                continue
            at += length
        else:
            raise BadRequest(f"the message is not a ModelInferRequest (wire type {wire})")
        if at > len(view):
            raise BadRequest("the message is not a ModelInferRequest (a field runs past "
                             "its end)")
        rest += view[start:at]
    try:
        return pb.ModelInferRequest.FromString(bytes(rest)), raw
    except DecodeError:
        raise BadRequest("the message is not a ModelInferRequest") from None


def decode_infer_request(request: Any, limits: Limits = NO_LIMITS,
                         raw: list[memoryview] | None = None
                         ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(inputs by name, ``{"id", "parameters", "outputs"}`` as ``decode_v2_request``
    gives them) from a ``ModelInferRequest`` (``raw``: its ``raw_input_contents`` as
    ``split_infer_request`` gives them); ``BadRequest`` naming the problem,
    ``TooLarge`` past ``limits`` (checked from the declared shapes before any tensor is
    built, as over HTTP)."""
    if not request.inputs:
        raise BadRequest("the request has no inputs")
    raw = request.raw_input_contents if raw is None else raw
    if raw and len(raw) != len(request.inputs):
        raise BadRequest(f"raw_input_contents holds {len(raw)} entries for "
                         f"{len(request.inputs)} inputs: one per input, in order")
    inputs: dict[str, np.ndarray] = {}
    total = 0
    for i, tensor in enumerate(request.inputs):
        name = tensor.name
        if name in inputs:
            raise BadRequest(f"input {name!r} given twice")
        if tensor.datatype not in DATATYPES:
            raise BadRequest(f"input {name!r}: unknown datatype {tensor.datatype!r} "
                             f"(expected one of {', '.join(DATATYPES)})")
        parameters_of(tensor.parameters, f"input {name!r}: parameter")
        shape = _shape(tensor)
        # BYTES: the raw data sent, or a pointer per element (as decode_v2_request counts)
        nbytes = len(raw[i]) if raw and tensor.datatype == "BYTES" \
            else math.prod(shape) * DATATYPES[tensor.datatype].itemsize
        total += nbytes
        limits.check(name, shape[0] if shape else 1, nbytes, total)
        if raw:
            if tensor.HasField("contents"):
                raise BadRequest(f"input {name!r}: contents given while the request uses "
                                 "raw_input_contents")
            inputs[name] = _from_raw(raw[i], tensor.datatype, shape, name)
        else:
            inputs[name] = _from_contents(tensor.contents, tensor.datatype, shape, name)
    outputs = [{"name": o.name, "parameters": parameters_of(o.parameters,
                                                          f"output {o.name!r}: parameter")}
               for o in request.outputs] or None
    return inputs, {"id": request.id or None,
                    "parameters": parameters_of(request.parameters, "parameter"),
                    "outputs": outputs}


def encode_infer_response(model: str, version: int, results: dict[str, np.ndarray],
                          meta: dict[str, Any], parameters: dict[str, Any] | None = None
                          ) -> Any:
    """The ``ModelInferResponse``: the requested outputs (all, when none were named) in
    ``raw_output_contents``, in order; ``parameters`` (a selection app's answer) as
    ``InferParameter``s."""
    wanted = [o["name"] for o in meta["outputs"]] if meta["outputs"] else list(results)
    response = pb.ModelInferResponse(model_name=model, model_version=str(version),
                                     id=meta["id"] or "")
    for key, value in (parameters or {}).items():
        kind = ("bool_param" if isinstance(value, bool) else "int64_param"
                if isinstance(value, int) else "double_param" if isinstance(value, float)
                else "string_param")
        setattr(response.parameters[key], kind, value)
    for name in wanted:
        if name not in results:
            raise BadRequest(f"unknown output {name!r}: the model's outputs are "
                             f"{', '.join(results)}")
        array = results[name]
        datatype = datatype_of(array)
        response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        response.raw_output_contents.append(
            to_bytes_elements(array) if datatype == "BYTES"
            else np.ascontiguousarray(array).tobytes())
    return response
