"""Tensor codecs: Open Inference Protocol v2 (JSON and the binary-data extension that
``tritonclient.http`` uses) and TF Serving REST (row ``instances`` / columnar ``inputs``).

Decoders raise ``BadRequest`` naming the problem; nothing here touches models.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

try:  # several times faster than json at writing an infer response
    import orjson
except ImportError:  # pragma: no cover - a declared dependency; json is the fallback
    orjson = None

from agent.backends.base import DATATYPES, InvalidInput, TensorSpec, check_inputs, datatype_of
from agent.node.jsonnumbers import Lifted, lift, numbers
from agent.validation import load_json


class BadRequest(InvalidInput):
    """The request body is malformed (a 400)."""


class TooLarge(BadRequest):
    """The request would decode to more than its limits allow (a 413)."""

    status = 413


@dataclass(frozen=True)
class Limits:
    """What one request may decode to, checked from its declared shapes before any
    tensor is built: ``max_rows`` rows (first dimension) per input and ``max_bytes``
    of tensor data in all (None: unlimited)."""

    max_rows: int | None = None
    max_bytes: int | None = None

    def check(self, name: str, rows: int, nbytes: int, total: int) -> None:
        """TooLarge when input ``name`` (``rows`` rows, ``nbytes``) breaks a limit, or
        brings the request's tensors to ``total`` bytes past ``max_bytes``."""
        if self.max_rows is not None and rows > self.max_rows:
            raise TooLarge(f"input {name!r}: {rows} rows, over the limit of {self.max_rows} "
                           "rows per request (max_request_rows): split the request")
        if self.max_bytes is not None and total > self.max_bytes:
            raise TooLarge(f"input {name!r}: the request's tensors take {total} bytes, over "
                           f"the limit of {self.max_bytes} bytes (max_tensor_bytes)")


NO_LIMITS = Limits()

#: The JSON of an infer body parsed as Python objects (all but its large numeric input
#: data, read straight into arrays: ``jsonnumbers``), whitespace aside; more is a 413.
JSON_OBJECTS_BYTES = 4 * 2**20

def parse_json(body: bytes) -> Any:
    """A JSON body (``agent.validation.load_json``: depth and number limits); BadRequest
    naming the problem."""
    try:
        return load_json(body)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object (``parse_json``); BadRequest for anything else."""
    return _json_object(body)


def _json_object(body: bytes) -> dict[str, Any]:
    doc = parse_json(body)
    if not isinstance(doc, dict):
        raise BadRequest("the request body must be a JSON object")
    return doc


# -- OIP v2 ---------------------------------------------------------------------------


def _shape(tensor: dict[str, Any], name: str) -> tuple[int, ...]:
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise BadRequest(f"input {name!r}: 'shape' must be a list of integers >= 0")
    return tuple(shape)


def from_bytes_elements(raw: bytes, count: int, name: str) -> np.ndarray:
    """BYTES binary layout: each element is a 4-byte little-endian length + its bytes."""
    out, offset = [], 0
    for _ in range(count):
        if offset + 4 > len(raw):
            raise BadRequest(f"input {name!r}: BYTES binary data ends early")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise BadRequest(f"input {name!r}: BYTES element overruns the binary data")
        out.append(raw[offset:offset + length])
        offset += length
    if offset != len(raw):
        raise BadRequest(f"input {name!r}: {len(raw) - offset} unexpected trailing bytes")
    return np.array(out + [None], dtype=object)[:-1]


def to_bytes_elements(array: np.ndarray) -> bytes:
    parts = []
    for item in array.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode()
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def _from_json_data(data: Any, datatype: str, shape: tuple[int, ...], name: str) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        flat = _flatten(data, name)
        if len(flat) != count:
            raise BadRequest(f"input {name!r}: {len(flat)} elements, shape {list(shape)} "
                             f"needs {count}")
        items = []
        for x in flat:
            if isinstance(x, str):
                items.append(x.encode())
            else:
                raise BadRequest(f"input {name!r}: BYTES elements must be strings")
        return np.array(items + [None], dtype=object)[:-1].reshape(shape)
    try:
        array = np.asarray(data)
    except ValueError:
        raise BadRequest(f"input {name!r}: 'data' is ragged or not numbers") from None
    if array.size != count:
        raise BadRequest(f"input {name!r}: {array.size} elements, shape {list(shape)} "
                         f"needs {count}")
    kind = array.dtype.kind
    if datatype == "BOOL":
        if kind != "b" and array.size:
            raise BadRequest(f"input {name!r}: BOOL data must be true/false")
    elif kind not in "biuf" and array.size:
        raise BadRequest(f"input {name!r}: {datatype} data must be numbers")
    elif kind == "f" and datatype[0] in "IU" and array.size:
        raise BadRequest(f"input {name!r}: {datatype} data must be integers")
    try:
        with np.errstate(over="raise", invalid="raise"):
            return array.astype(DATATYPES[datatype], casting="unsafe").reshape(shape)
    except (FloatingPointError, OverflowError):
        raise BadRequest(f"input {name!r}: values out of range for {datatype}") from None


def _flatten(data: Any, name: str) -> list:
    if not isinstance(data, list):
        return [data]
    out: list = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def decode_v2_request(body: bytes, header_length: int | None, limits: Limits = NO_LIMITS
                      ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(inputs by name, the request JSON minus input data) from an OIP v2 infer body;
    ``limits`` are checked from each input's declared shape before its data is read.
    Large numeric input data is read straight into arrays (``jsonnumbers``); the rest
    of the JSON, parsed as objects, may hold ``JSON_OBJECTS_BYTES``: decoding costs a
    few times the body, not tens."""
    if header_length is not None:
        if header_length < 0 or header_length > len(body):
            raise BadRequest("Inference-Header-Content-Length exceeds the body")
        text, binary = body[:header_length], memoryview(body)[header_length:]
    else:
        text, binary = body, memoryview(b"")
    text, lifted = lift(text)
    objects = len(text) if len(text) <= JSON_OBJECTS_BYTES else \
        len(text) - sum(text.count(c) for c in (b" ", b"\n", b"\t", b"\r"))
    if objects > JSON_OBJECTS_BYTES:
        raise TooLarge(f"{objects} bytes of the body's JSON are not numeric input data, over "
                       f"the limit of {JSON_OBJECTS_BYTES}: send large BYTES or BOOL inputs "
                       "as binary data (binary_data_size)")
    doc = _json_object(text)
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("'inputs' must be a non-empty list")
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise BadRequest("'parameters' must be an object")
    inputs: dict[str, np.ndarray] = {}
    offset = total = 0
    for tensor in raw_inputs:
        name, datatype, shape, size = _declared(tensor, inputs)
        count = math.prod(shape)
        # BYTES: the binary data sent, or a pointer per element
        nbytes = size if datatype == "BYTES" and isinstance(size, int) \
            else count * DATATYPES[datatype].itemsize
        total += nbytes
        limits.check(name, shape[0] if shape else 1, nbytes, total)
        if size is not None:
            inputs[name] = _binary_input(binary, offset, size, name, datatype, shape)
            offset += size
        else:
            inputs[name] = _json_input(tensor, lifted, name, datatype, shape)
    if len(lifted.used) != len(lifted.spans):
        raise BadRequest("a numeric 'data' array outside 'inputs'")
    if offset != len(binary):
        raise BadRequest(f"{len(binary) - offset} bytes of binary data belong to no input")
    outputs = _outputs(doc)
    return inputs, {"id": _request_id(doc), "parameters": params, "outputs": outputs}


def _declared(tensor: Any, seen: dict[str, np.ndarray]
              ) -> tuple[str, str, tuple[int, ...], Any]:
    """An input's name, datatype, shape and ``binary_data_size`` (None: JSON data)."""
    if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
        raise BadRequest("each input must be an object with a string 'name'")
    name = tensor["name"]
    if name in seen:
        raise BadRequest(f"input {name!r} given twice")
    datatype = tensor.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise BadRequest(f"input {name!r}: unknown datatype {datatype!r} (expected one "
                         f"of {', '.join(DATATYPES)})")
    shape = _shape(tensor, name)
    tparams = tensor.get("parameters") or {}
    if not isinstance(tparams, dict):
        raise BadRequest(f"input {name!r}: 'parameters' must be an object")
    return name, datatype, shape, tparams.get("binary_data_size")


def _binary_input(binary: memoryview, offset: int, size: Any, name: str, datatype: str,
                  shape: tuple[int, ...]) -> np.ndarray:
    """An input sent as ``size`` bytes of binary data at ``offset``."""
    if not isinstance(size, int) or size < 0 or offset + size > len(binary):
        raise BadRequest(f"input {name!r}: binary_data_size {size!r} exceeds the "
                         "binary data sent")
    raw = bytes(binary[offset:offset + size])
    count = math.prod(shape)
    if datatype == "BYTES":
        return from_bytes_elements(raw, count, name).reshape(shape)
    dtype = DATATYPES[datatype]
    if size != count * dtype.itemsize:
        raise BadRequest(f"input {name!r}: {size} bytes of binary data, shape "
                         f"{list(shape)} of {datatype} needs {count * dtype.itemsize}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def _json_input(tensor: dict, lifted: Lifted, name: str, datatype: str,
                shape: tuple[int, ...]) -> np.ndarray:
    """An input sent as JSON ``data`` (numeric arrays read straight, ``jsonnumbers``)."""
    if (span := lifted.span_of(tensor.get("data"))) is not None:
        if datatype in ("BYTES", "BOOL"):
            raise BadRequest(f"input {name!r}: {datatype} data must be "
                             f"{'strings' if datatype == 'BYTES' else 'true/false'}")
        return numbers(lifted, span, datatype, shape, name)
    if "data" in tensor:
        return _from_json_data(tensor["data"], datatype, shape, name)
    raise BadRequest(f"input {name!r}: no 'data' and no binary_data_size")


def _outputs(doc: dict) -> list | None:
    """The outputs asked for, checked before the model runs, not after."""
    outputs = doc.get("outputs")
    if outputs is not None and (not isinstance(outputs, list) or not all(
            isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs)):
        raise BadRequest("'outputs' must be a list of objects with a string 'name'")
    for o in outputs or ():
        if not isinstance(o.get("parameters", {}), (dict, type(None))):
            raise BadRequest(f"output {o['name']!r}: 'parameters' must be an object")
    return outputs


def _request_id(doc: dict) -> str | None:
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest("'id' must be a string")
    return rid


def encode_v2_response(model: str, version: int, results: dict[str, np.ndarray],
                       request: dict[str, Any]) -> tuple[bytes, int | None]:
    """(body, JSON header length or None) for an OIP v2 infer response."""
    params = request["parameters"]
    binary_default = bool(params.get("binary_data_output", False))
    wanted = request["outputs"]
    if wanted is None:
        wanted = [{"name": n} for n in results]
    outs, blobs = [], []
    for o in wanted:
        name = o["name"]
        if name not in results:
            raise BadRequest(f"unknown output {name!r}: the model's outputs are "
                             f"{', '.join(results)}")
        array = results[name]
        datatype = datatype_of(array)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        binary = (o.get("parameters") or {}).get("binary_data", binary_default)
        if binary:
            blob = (to_bytes_elements(array) if datatype == "BYTES"
                    else np.ascontiguousarray(array).tobytes())
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif datatype == "BYTES":
            entry["data"] = [x.decode(errors="replace") if isinstance(x, bytes) else str(x)
                             for x in array.reshape(-1)]
        else:
            entry["data"] = array.reshape(-1).tolist()
        outs.append(entry)
    doc: dict[str, Any] = {"model_name": model, "model_version": str(version), "outputs": outs}
    if request["id"] is not None:
        doc["id"] = request["id"]
    passthrough = {k: v for k, v in params.items() if k != "binary_data_output"}
    if passthrough:
        doc["parameters"] = passthrough
    if not blobs:
        return dumps(doc, newline=True), None
    header = dumps(doc)
    return header + b"".join(blobs), len(header)


def dumps(doc: Any, *, newline: bool = False) -> bytes:
    """Compact JSON, as ``json.dumps(doc, separators=(",", ":"))`` writes it (``newline``:
    then a newline, as a whole answer ends). orjson where its output means the same: it
    writes NaN and infinities as null and non-ASCII unescaped, so any output holding a
    null or a non-ASCII byte (and anything orjson refuses) is written by json instead."""
    if orjson is not None:
        try:
            out = orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE if newline else None)
        except TypeError:
            pass
        else:
            if out.isascii() and b"null" not in out:
                return out
    return (json.dumps(doc, separators=(",", ":")) + ("\n" if newline else "")).encode()


# -- TF Serving REST --------------------------------------------------------------------


def _tf_value(value: Any, spec: TensorSpec, what: str) -> np.ndarray:
    if spec.datatype == "BYTES":
        def conv(x: Any) -> Any:
            if isinstance(x, list):
                return [conv(y) for y in x]
            if isinstance(x, dict) and set(x) == {"b64"} and isinstance(x["b64"], str):
                try:
                    return base64.b64decode(x["b64"], validate=True)
                except ValueError:
                    raise BadRequest(f"{what}: invalid base64") from None
            if isinstance(x, str):
                return x.encode()
            raise BadRequest(f"{what}: expected strings")
        converted = conv(value)
        flat = _flatten(converted, what)
        try:
            shape = np.asarray(converted, dtype=object).shape
        except ValueError:
            raise BadRequest(f"{what}: ragged nested lists") from None
        return np.array(flat + [None], dtype=object)[:-1].reshape(shape)
    try:
        array = np.asarray(value)
    except ValueError:
        raise BadRequest(f"{what}: ragged nested lists") from None
    if array.dtype.kind not in "biuf" and array.size:
        raise BadRequest(f"{what}: expected numbers for a {spec.datatype} input")
    if spec.datatype == "BOOL" and array.dtype.kind != "b" and array.size:
        raise BadRequest(f"{what}: expected true/false for a BOOL input")
    return array.astype(DATATYPES[spec.datatype])


def _nested_shape(value: Any) -> tuple[int, ...]:
    """The shape nested lists declare, read along their first elements (ragged lists
    are refused later, when numpy reads them)."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return tuple(shape)


def check_tf_size(doc: dict[str, Any], specs: list[TensorSpec] | None,
                  limits: Limits) -> None:
    """TooLarge when a TF Serving body's tensors, by the shapes their nested lists
    declare, break ``limits`` (bytes at each input's datatype; with no ``specs``, the
    model not loaded yet, only rows are checked)."""
    by_name = {s.name: s for s in specs or ()}
    columns: dict[str, Any] = {}
    rows = doc.get("instances")
    if isinstance(rows, list):
        if rows and all(isinstance(r, dict) for r in rows):
            columns = {n: [r.get(n) for r in rows[:1]] for n in rows[0]}
            lengths = {n: len(rows) for n in columns}
        else:
            columns, lengths = {"instances": rows}, {"instances": len(rows)}
    elif isinstance(doc.get("inputs"), dict):
        columns = doc["inputs"]
        lengths = {n: len(v) if isinstance(v, list) else 1 for n, v in columns.items()}
    elif "inputs" in doc:
        columns = {"inputs": doc["inputs"]}
        lengths = {"inputs": len(doc["inputs"]) if isinstance(doc["inputs"], list) else 1}
    total = 0
    for n, value in columns.items():
        spec = by_name.get(n) or (specs[0] if specs and len(specs) == 1 else None)
        rows_n = lengths[n]
        nbytes = 0
        if spec is not None:
            shape = _nested_shape(value)
            per_row = math.prod(shape[1:]) if shape else 1
            nbytes = rows_n * per_row * DATATYPES[spec.datatype].itemsize
        total += nbytes
        limits.check(spec.name if spec is not None else n, rows_n, nbytes, total)


def decode_tf_checked(body: bytes | dict[str, Any], specs: list[TensorSpec],
                      limits: Limits = NO_LIMITS) -> tuple[dict[str, np.ndarray], str]:
    """``decode_tf_request``, then the inputs checked against ``specs``
    (``check_inputs``): all a predict needs before the model runs, in one call."""
    inputs, style = decode_tf_request(body, specs, limits)
    check_inputs(specs, inputs)
    return inputs, style


def encode_tf_body(results: dict[str, np.ndarray], style: str) -> bytes:
    """The JSON body of a TF Serving answer (``encode_tf_response``, then ``dumps``)."""
    return dumps(encode_tf_response(results, style), newline=True)


def decode_tf_request(body: bytes | dict[str, Any], specs: list[TensorSpec],
                      limits: Limits = NO_LIMITS) -> tuple[dict[str, np.ndarray], str]:
    """(inputs, "row" or "columnar") from a TF Serving ``:predict`` body (its bytes, or
    the JSON object already parsed by ``json_object``); ``limits`` are checked from the
    shapes its lists declare before any tensor is built."""
    doc = body if isinstance(body, dict) else _json_object(body)
    check_tf_size(doc, specs, limits)
    by_name = {s.name: s for s in specs}
    has_rows, has_cols = "instances" in doc, "inputs" in doc
    if has_rows == has_cols:
        raise BadRequest("the body needs exactly one of 'instances' (row format) or "
                         "'inputs' (columnar format)")
    unknown = set(doc) - {"instances", "inputs", "signature_name"}
    if unknown:
        raise BadRequest(f"unknown field(s) {', '.join(sorted(unknown))}")
    if has_rows:
        rows = doc["instances"]
        if not isinstance(rows, list) or not rows:
            raise BadRequest("'instances' must be a non-empty list")
        if all(isinstance(r, dict) for r in rows):
            names = set(rows[0])
            if any(set(r) != names for r in rows):
                raise BadRequest("every instance must name the same inputs")
            _check_names(names, by_name)
            return {n: _tf_value([r[n] for r in rows], by_name[n], f"input {n!r}")
                    for n in names}, "row"
        if len(specs) != 1:
            raise BadRequest(f"the model has {len(specs)} inputs: each instance must be an "
                             "object naming them")
        spec = specs[0]
        return {spec.name: _tf_value(rows, spec, f"input {spec.name!r}")}, "row"
    cols = doc["inputs"]
    if isinstance(cols, dict):
        _check_names(set(cols), by_name)
        return {n: _tf_value(v, by_name[n], f"input {n!r}") for n, v in cols.items()}, "columnar"
    if len(specs) != 1:
        raise BadRequest(f"the model has {len(specs)} inputs: 'inputs' must be an object")
    spec = specs[0]
    return {spec.name: _tf_value(cols, spec, f"input {spec.name!r}")}, "columnar"


def _check_names(names: set[str], by_name: dict[str, TensorSpec]) -> None:
    for n in sorted(names - set(by_name)):
        raise BadRequest(f"unknown input {n!r}: the model's inputs are {', '.join(by_name)}")


def _tf_json(array: np.ndarray) -> Any:
    if array.dtype == object:
        return np.vectorize(lambda x: x.decode(errors="replace") if isinstance(x, bytes)
                            else str(x), otypes=[object])(array).tolist() if array.size else []
    return array.tolist()


def encode_tf_response(results: dict[str, np.ndarray], style: str) -> dict[str, Any]:
    if style == "row":
        if len(results) == 1:
            return {"predictions": _tf_json(next(iter(results.values())))}
        n = len(next(iter(results.values())))
        cols = {k: _tf_json(v) for k, v in results.items()}
        return {"predictions": [{k: cols[k][i] for k in cols} for i in range(n)]}
    if len(results) == 1:
        return {"outputs": _tf_json(next(iter(results.values())))}
    return {"outputs": {k: _tf_json(v) for k, v in results.items()}}
