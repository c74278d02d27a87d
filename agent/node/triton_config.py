"""Triton model configuration: a model directory's ``config.pbtxt`` (protobuf text
format), a load's ``parameters.config`` override (JSON), and the effective
configuration ``GET /v2/models/{name}/config`` answers, in Triton's field names.

Both inputs are parsed into one minimal ``ModelConfig`` message defined here (a subset
of Triton's model_config.proto, field names kept): what it lacks is refused by the
parser, naming the field. What maps onto the agent's model config is applied:

- ``name`` must be the model's directory name; ``platform``/``backend`` must name the
  runtime the model's files are for (onnxruntime_onnx / onnxruntime,
  tensorflow_savedmodel / tensorflow);
- ``max_batch_size`` -> ``max_batch_size``; ``input``/``output`` (name, data_type,
  dims: without the batch dimension when max_batch_size > 0) are checked against the
  model at load;
- ``dynamic_batching`` -> batching on, ``max_queue_delay_microseconds`` ->
  ``batching.window_ms_max``; in a config.pbtxt its absence turns batching off, as in
  Triton; ``preferred_batch_size`` is refused (the batcher sizes batches to the SLO);
- one ``instance_group``: ``count`` -> ``batching.workers``, ``kind`` KIND_CPU -> cpu,
  KIND_GPU with one of ``gpus`` -> cuda:N.

Anything else (ensembles, sequence batching, version policies, optimization, model
warm-up, several instance groups...) is refused with the file and the field named.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from agent.config import DeclaredTensor, ModelConfig
from agent.validation import ConfigError

_DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
              "INT64", "FP16", "FP32", "FP64", "STRING", "BF16")
#: platform / backend names -> the agent's backend.
_PLATFORMS = {"onnxruntime_onnx": "onnx", "tensorflow_savedmodel": "tfserving"}
_BACKENDS = {"onnxruntime": "onnx", "tensorflow": "tfserving"}
PLATFORM_OF = {"onnx": "onnxruntime_onnx", "tfserving": "tensorflow_savedmodel",
               "synthetic": "synthetic"}
BACKEND_OF = {"onnx": "onnxruntime", "tfserving": "tensorflow", "synthetic": "synthetic"}
#: Triton fields this agent cannot honour, with why (for a clearer refusal).
_REFUSED = {
    "ensemble_scheduling": "ensembles are not supported",
    "sequence_batching": "stateful models (sequence batching) are not supported",
    "version_policy": "the agent serves every version in the directory (the highest by "
                      "default); version policies are not supported",
    "model_warmup": "use warmup: in config.yaml (a v2 inputs file) instead",
    "optimization": "set onnxruntime: options in config.yaml instead",
    "model_transaction_policy": "decoupled models are not supported",
    "parameters": "backend parameters are not supported",
    "response_cache": "set prediction_cache: in config.yaml instead",
}


def _message_class():
    """The minimal ModelConfig message class (built once per call site; cached)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fp = descriptor_pb2.FileDescriptorProto(name="edgeagent_triton_config.proto",
                                            package="edgeagent.triton", syntax="proto2")
    dt = fp.enum_type.add(name="DataType")
    for i, name in enumerate(("INVALID",) + _DATATYPES):
        dt.value.add(name=f"TYPE_{name}", number=i)
    fmt = fp.enum_type.add(name="Format")
    for i, name in enumerate(("FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW")):
        fmt.value.add(name=name, number=i)
    kind = fp.enum_type.add(name="Kind")
    for i, name in enumerate(("KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL")):
        kind.value.add(name=name, number=i)

    def message(name: str, fields: list[tuple]) -> None:
        m = fp.message_type.add(name=name)
        for number, (fname, ftype, label, type_name) in enumerate(fields, 1):
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = f".edgeagent.triton.{type_name}"

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    tensor = [("name", F.TYPE_STRING, opt, None), ("data_type", F.TYPE_ENUM, opt, "DataType"),
              ("dims", F.TYPE_INT64, rep, None), ("is_shape_tensor", F.TYPE_BOOL, opt, None)]
    message("ModelInput", tensor + [("format", F.TYPE_ENUM, opt, "Format"),
                                    ("allow_ragged_batch", F.TYPE_BOOL, opt, None),
                                    ("optional", F.TYPE_BOOL, opt, None)])
    message("ModelOutput", tensor + [("label_filename", F.TYPE_STRING, opt, None)])
    message("ModelDynamicBatching", [
        ("preferred_batch_size", F.TYPE_INT32, rep, None),
        ("max_queue_delay_microseconds", F.TYPE_UINT64, opt, None)])
    message("ModelInstanceGroup", [
        ("name", F.TYPE_STRING, opt, None), ("kind", F.TYPE_ENUM, opt, "Kind"),
        ("count", F.TYPE_INT32, opt, None), ("gpus", F.TYPE_INT32, rep, None)])
    message("ModelConfig", [
        ("name", F.TYPE_STRING, opt, None), ("platform", F.TYPE_STRING, opt, None),
        ("backend", F.TYPE_STRING, opt, None), ("max_batch_size", F.TYPE_INT32, opt, None),
        ("input", F.TYPE_MESSAGE, rep, "ModelInput"),
        ("output", F.TYPE_MESSAGE, rep, "ModelOutput"),
        ("dynamic_batching", F.TYPE_MESSAGE, opt, "ModelDynamicBatching"),
        ("instance_group", F.TYPE_MESSAGE, rep, "ModelInstanceGroup"),
        ("default_model_filename", F.TYPE_STRING, opt, None)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fp)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("edgeagent.triton.ModelConfig"))


_CLASS: list = []


def _new_message():
    if not _CLASS:
        _CLASS.append(_message_class())
    return _CLASS[0]()


def _refusal(text: str) -> str:
    """A parser's 'no field named X' turned into why the agent refuses X."""
    match = re.search(r'no field named "(\w+)"|no field named "?(\w+)"?|field "(\w+)"', text)
    name = next((g for g in (match.groups() if match else ()) if g), None)
    if name in _REFUSED:
        return f"{name}: cannot be honoured: {_REFUSED[name]}"
    if name is not None and "no field named" in text:
        return f"{name}: cannot be honoured (not a field this agent supports)"
    return text


def parse_pbtxt(text: str, file: str) -> Any:
    """The message in ``text`` (protobuf text format); ``ConfigError`` naming ``file``,
    the line and the field otherwise."""
    from google.protobuf import text_format

    msg = _new_message()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as exc:
        where = f"line {exc.GetLine()}" if exc.GetLine() else None
        raise ConfigError(file, where, _refusal(str(exc).split(" : ", 1)[-1])) from None
    return msg


def parse_json_config(data: Any, file: str) -> Any:
    """The message in a parsed JSON object (protobuf's JSON mapping: integers may be
    given as strings, ``"16"``); ``ConfigError`` naming the field otherwise."""
    from google.protobuf import json_format

    if not isinstance(data, dict):
        raise ConfigError(file, None, f"must be a JSON object, got {type(data).__name__}")
    msg = _new_message()
    try:
        json_format.ParseDict(data, msg)
    except json_format.ParseError as exc:
        raise ConfigError(file, None, _refusal(str(exc))) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise ConfigError(file, None, str(exc)) from None
    return msg


def _declared(tensors: Any, batched: bool, what: str, file: str) -> tuple[DeclaredTensor, ...]:
    out = []
    for i, t in enumerate(tensors):
        key = f"{what}[{i}]"
        if not t.name:
            raise ConfigError(file, f"{key}.name", "required")
        if not t.HasField("data_type") or t.data_type == 0:
            raise ConfigError(file, f"{key}.data_type", "required (TYPE_FP32, ...)")
        datatype = _DATATYPES[t.data_type - 1]
        if datatype == "BF16":
            raise ConfigError(file, f"{key}.data_type", "TYPE_BF16 is not supported")
        for flag in ("is_shape_tensor", "allow_ragged_batch", "optional"):
            if t.DESCRIPTOR.fields_by_name.get(flag) and getattr(t, flag):
                raise ConfigError(file, f"{key}.{flag}", "cannot be honoured (true)")
        if what == "input" and t.format != 0:
            raise ConfigError(file, f"{key}.format", "cannot be honoured (only FORMAT_NONE)")
        if what == "output" and t.label_filename:
            raise ConfigError(file, f"{key}.label_filename", "classification labels are "
                              "not supported")
        if any(d < -1 or d == 0 for d in t.dims):
            raise ConfigError(file, f"{key}.dims", f"must be sizes > 0 or -1, got {list(t.dims)}")
        shape = ((-1,) if batched else ()) + tuple(int(d) for d in t.dims)
        out.append(DeclaredTensor(t.name, "BYTES" if datatype == "STRING" else datatype, shape))
    if len({t.name for t in out}) != len(out):
        raise ConfigError(file, what, "names must be unique")
    return tuple(out)


def apply(msg: Any, config: ModelConfig, *, model: str, backend: str | None, file: str,
          conflicts: bool) -> ModelConfig:
    """``config`` with what ``msg`` says applied. ``conflicts``: a key config.yaml set to
    something else is an error (a config.pbtxt beside a config.yaml); otherwise ``msg``
    wins (a load's override)."""
    applied = _Applied(config, file, conflicts)
    applied.identity(msg, model, backend)
    applied.batch_size(msg)
    applied.dynamic_batching(msg)
    applied.instance_group(msg)
    return applied.config_now()


class _Applied:
    """A config.pbtxt applied over ``config``, a section at a time (``apply``)."""

    def __init__(self, config: ModelConfig, file: str, conflicts: bool) -> None:
        self.config, self.file, self.conflicts = config, file, conflicts
        self.changes: dict[str, Any] = {}
        self.batching: dict[str, Any] = {}

    def put(self, target: dict, key: str, value: Any, current: Any, field: str) -> None:
        if self.conflicts and current is not None and current != value:
            raise ConfigError(self.file, field,
                              f"says {value!r} but config.yaml says {current!r}")
        target[key] = value

    def identity(self, msg: Any, model: str, backend: str | None) -> None:
        """Its name, platform or backend, and model file name must be the model's."""
        file = self.file
        if msg.HasField("name") and msg.name != model:
            raise ConfigError(file, "name", f"{msg.name!r} is not the model's directory name "
                              f"{model!r}")
        for field, table in (("platform", _PLATFORMS), ("backend", _BACKENDS)):
            if msg.HasField(field):
                value = getattr(msg, field)
                if value == "ensemble":
                    raise ConfigError(file, field, "ensembles are not supported")
                if value not in table:
                    raise ConfigError(file, field, f"{value!r} cannot be served by edgeagent "
                                      f"(supported: {', '.join(table)})")
                if backend is not None and table[value] != backend:
                    raise ConfigError(file, field, f"{value!r} does not match the model's "
                                      f"files (backend {backend})")
        if msg.HasField("default_model_filename") and msg.default_model_filename not in (
                "model.onnx", "model.savedmodel", "saved_model.pb"):
            raise ConfigError(file, "default_model_filename", "cannot be honoured: the agent "
                              "loads <version>/model.onnx or <version>/saved_model.pb")

    def batch_size(self, msg: Any) -> None:
        """``max_batch_size`` and the declared inputs and outputs (batched or not)."""
        config, file, changes = self.config, self.file, self.changes
        max_batch = config.max_batch_size
        if msg.HasField("max_batch_size"):
            if msg.max_batch_size < 0:
                raise ConfigError(file, "max_batch_size",
                                  f"must be >= 0, got {msg.max_batch_size}")
            self.put(changes, "max_batch_size", msg.max_batch_size, config.max_batch_size,
                     "max_batch_size")
            max_batch = msg.max_batch_size
        batched = bool(max_batch)
        if msg.input:
            changes["declared_inputs"] = _declared(msg.input, batched, "input", file)
        if msg.output:
            changes["declared_outputs"] = _declared(msg.output, batched, "output", file)
        if msg.input or msg.output:
            changes["declared_in"] = file
        elif not self.conflicts:  # an override replaces the declarations: the model's own
            changes.update(declared_inputs=None, declared_outputs=None, declared_in=None)

    def dynamic_batching(self, msg: Any) -> None:
        b = self.config.batching
        if msg.HasField("dynamic_batching"):
            db = msg.dynamic_batching
            if db.preferred_batch_size:
                raise ConfigError(self.file, "dynamic_batching.preferred_batch_size",
                                  "cannot be honoured: the agent sizes batches to the SLO "
                                  "(set max_batch_size, and batching.adaptive: false in "
                                  "config.yaml for a fixed limit)")
            self.put(self.batching, "enabled", True, b.enabled, "dynamic_batching")
            if db.HasField("max_queue_delay_microseconds"):
                self.put(self.batching, "window_ms_max", db.max_queue_delay_microseconds / 1000,
                         b.window_ms_max, "dynamic_batching.max_queue_delay_microseconds")
        elif self.conflicts:  # a config.pbtxt without dynamic_batching: Triton does not batch
            self.put(self.batching, "enabled", False, b.enabled, "dynamic_batching")

    def instance_group(self, msg: Any) -> None:
        """One group: its count (workers) and kind (the device)."""
        file, config = self.file, self.config
        if len(msg.instance_group) > 1:
            raise ConfigError(file, "instance_group", "only one instance group is supported")
        if not msg.instance_group:
            return
        group = msg.instance_group[0]
        if group.HasField("count"):
            if not 1 <= group.count <= 256:
                raise ConfigError(file, "instance_group[0].count",
                                  f"must be 1..256, got {group.count}")
            self.put(self.batching, "workers", group.count, config.batching.workers,
                     "instance_group[0].count")
        kind = group.DESCRIPTOR.fields_by_name["kind"].enum_type.values_by_number[
            group.kind].name
        if kind == "KIND_MODEL":
            raise ConfigError(file, "instance_group[0].kind", "KIND_MODEL is not supported")
        if kind != "KIND_GPU" and group.gpus:
            raise ConfigError(file, "instance_group[0].gpus", f"only with KIND_GPU, not {kind}")
        current = config.device if config.device != "cpu" else None
        if kind == "KIND_CPU":
            self.put(self.changes, "device", "cpu", current, "instance_group[0].kind")
        elif kind == "KIND_GPU":
            if len(group.gpus) != 1:
                raise ConfigError(file, "instance_group[0].gpus", "name exactly one GPU "
                                  f"(instances on several GPUs are not supported), got "
                                  f"{list(group.gpus)}")
            self.put(self.changes, "device", f"cuda:{group.gpus[0]}", current,
                     "instance_group[0].gpus")

    def config_now(self) -> ModelConfig:
        changes = dict(self.changes)
        if self.batching:
            changes["batching"] = msgspec.structs.replace(self.config.batching, **self.batching)
        return msgspec.structs.replace(self.config, **changes)


def effective_config(name: str, backend: str | None, config: ModelConfig, settings: Any,
                     inputs: list, outputs: list, workers: int, batchable: bool
                     ) -> dict[str, Any]:
    """``GET /v2/models/{name}/config`` in Triton's field names. ``settings``: the
    model's resolved serving settings; ``inputs``/``outputs``: its signature
    (``TensorSpec``); dims leave out the batch dimension where max_batch_size > 0."""
    max_batch = settings.max_batch_size if batchable else 0

    def tensor(spec: Any, extra: dict[str, Any]) -> dict[str, Any]:
        dims = list(spec.shape[1:] if max_batch else spec.shape)
        dtype = "TYPE_STRING" if spec.datatype == "BYTES" else f"TYPE_{spec.datatype}"
        return {"name": spec.name, "data_type": dtype, "dims": dims, **extra}

    device = config.device
    out: dict[str, Any] = {
        "name": name, "platform": PLATFORM_OF.get(backend or "", "unknown"),
        "backend": BACKEND_OF.get(backend or "", "unknown"),
        "max_batch_size": max_batch,
        "input": [tensor(s, {"format": "FORMAT_NONE", "is_shape_tensor": False,
                             "allow_ragged_batch": False, "optional": False})
                  for s in inputs],
        "output": [tensor(s, {"label_filename": "", "is_shape_tensor": False})
                   for s in outputs],
        "instance_group": [{"name": f"{name}_0", "count": workers,
                            "kind": "KIND_CPU" if device == "cpu" else "KIND_GPU",
                            "gpus": [] if device == "cpu"
                            else [int(device.partition(":")[2] or 0)]}],
    }
    if batchable and settings.batching:
        out["dynamic_batching"] = {
            "preferred_batch_size": [],
            "max_queue_delay_microseconds": int(round(settings.tuner.window_max * 1e6))}
    return out
