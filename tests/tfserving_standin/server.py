"""STAND-IN for ``tensorflow_model_server``, for the tests only: never serve with it.

The real binary cannot be installed from the package registries the test machines reach,
so this speaks TF Serving's gRPC protocol (the tensorflow-serving-api protos, real gRPC)
on TensorFlow's own Python runtime, implementing only what ``agent.backends.tfserving``
uses:

- ModelService.HandleReloadConfigRequest: the model list in the request *replaces* the
  whole current one, as in TF Serving (versions not listed are unloaded, new ones
  loaded); it answers once the new versions are AVAILABLE or failed (END + reason),
  with the failures as the call's error, as TF Serving does;
- ModelService.GetModelStatus: START/LOADING/AVAILABLE/UNLOADING/END per version,
  NOT_FOUND for versions never configured;
- PredictionService.Predict (dense tensors, a signature by name) and GetModelMetadata
  (``signature_def``, read from the SavedModel's MetaGraphDef).

Command line: the real binary's flags the agent passes: ``--port``,
``--model_config_file`` (text ModelServerConfig, loaded before the port opens),
``--file_system_poll_wait_seconds`` and ``--max_num_load_retries`` (accepted; this never
polls nor retries), ``--tensorflow_intra_op_parallelism``,
``--tensorflow_inter_op_parallelism``. Unknown flags are an error, as in the real binary.
Not implemented: REST, batching, version labels, warm-up files, Classify/Regress/
MultiInference, model platforms other than ``tensorflow``. Listens on 127.0.0.1 only.

    python tests/tfserving_standin/server.py --port=8500 --model_config_file=models.config
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import logging
import os
import signal
import sys
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc  # noqa: E402
import tensorflow as tf  # noqa: E402
from google.protobuf import text_format  # noqa: E402
from tensorflow.core.protobuf import saved_model_pb2  # noqa: E402
from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2,  # noqa: E402
                                     model_management_pb2, model_service_pb2_grpc,
                                     predict_pb2, prediction_service_pb2_grpc)
from tensorflow_serving.config import model_server_config_pb2  # noqa: E402

log = logging.getLogger("tfserving-standin")
State = get_model_status_pb2.ModelVersionStatus.State
# tensorflow.error.Code values used in StatusProto.
OK, UNKNOWN, NOT_FOUND = 0, 2, 5


class ServingError(Exception):
    """An error answered with a gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Version:
    """One model version's state, and the loaded SavedModel while AVAILABLE."""

    path: Path
    state: int = State.START
    error: str = ""
    loaded: Any = None
    signature_defs: dict = field(default_factory=dict)


def _trim_heap() -> None:
    libc = ctypes.util.find_library("c")
    if libc:
        try:
            ctypes.CDLL(libc).malloc_trim(0)
        except (OSError, AttributeError):
            pass


class Models:
    """The model set: (name, version) → Version; reloads replace it whole, one at a time."""

    def __init__(self) -> None:
        self.versions: dict[tuple[str, int], Version] = {}
        self.lock = threading.Lock()  # guards ``versions``
        self.reload_lock = threading.Lock()

    @staticmethod
    def wanted_versions(config: Any) -> list[int]:
        base = Path(config.base_path)
        on_disk = sorted(int(p.name) for p in base.iterdir()
                         if p.is_dir() and p.name.isdigit()) if base.is_dir() else []
        policy = config.model_version_policy
        kind = policy.WhichOneof("policy_choice")
        if kind == "specific":
            return sorted(set(policy.specific.versions))
        if kind == "all":
            return on_disk
        count = policy.latest.num_versions if kind == "latest" else 1
        return on_disk[-max(count, 1):]

    def reload(self, server_config: Any) -> list[str]:
        """Make the listed versions the whole model set; the load errors, if any."""
        if server_config.WhichOneof("config") != "model_config_list":
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               "ServerModelConfig type not supported by "
                               "HandleReloadConfigRequest. Only ModelConfigList is supported")
        wanted: dict[tuple[str, int], Path] = {}
        for config in server_config.model_config_list.config:
            if config.model_platform not in ("", "tensorflow"):
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"model platform {config.model_platform!r} is not "
                                   "supported by the stand-in")
            for version in self.wanted_versions(config):
                wanted[(config.name, version)] = Path(config.base_path) / str(version)
        with self.reload_lock:
            with self.lock:
                current = dict(self.versions)
            for key, entry in current.items():
                if entry.state == State.AVAILABLE and wanted.get(key) != entry.path:
                    self._unload(key, entry)
            errors = []
            for key, path in wanted.items():
                entry = current.get(key)
                if entry is not None and entry.state == State.AVAILABLE and entry.path == path:
                    continue
                error = self._load(key, path)
                if error:
                    errors.append(error)
            return errors

    def _load(self, key: tuple[str, int], path: Path) -> str | None:
        entry = Version(path, State.LOADING)
        with self.lock:
            self.versions[key] = entry
        log.info("loading %s:%d from %s", *key, path)
        try:
            if not (path / "saved_model.pb").is_file():
                raise FileNotFoundError(f"no SavedModel at {path}")
            meta = saved_model_pb2.SavedModel()
            meta.ParseFromString((path / "saved_model.pb").read_bytes())
            graphs = [g for g in meta.meta_graphs if "serve" in g.meta_info_def.tags]
            if not graphs:
                raise ValueError("the SavedModel has no MetaGraph tagged 'serve'")
            loaded = tf.saved_model.load(str(path), tags=["serve"])
        except Exception as exc:  # noqa: BLE001 - any failure is the model's
            entry.state, entry.error = State.END, f"{type(exc).__name__}: {exc}"
            log.error("loading %s:%d failed: %s", *key, entry.error)
            return f"Failed to load servable {key[0]}:{key[1]}: {entry.error}"
        entry.loaded, entry.signature_defs = loaded, dict(graphs[0].signature_def)
        entry.state = State.AVAILABLE
        return None

    def _unload(self, key: tuple[str, int], entry: Version) -> None:
        log.info("unloading %s:%d", *key)
        entry.state = State.UNLOADING
        entry.loaded = None
        gc.collect()
        _trim_heap()
        entry.state = State.END

    def find(self, spec: Any) -> tuple[int, Version]:
        """The AVAILABLE version a request's ModelSpec names (latest if none)."""
        with self.lock:
            available = {v: e for (n, v), e in self.versions.items()
                         if n == spec.name and e.state == State.AVAILABLE}
        if spec.HasField("version"):
            version = spec.version.value
            if version in available:
                return version, available[version]
            raise ServingError(grpc.StatusCode.NOT_FOUND, "Servable not found for request: "
                               f"Specific({spec.name}, {version})")
        if not available:
            raise ServingError(grpc.StatusCode.NOT_FOUND,
                               f"Servable not found for request: Latest({spec.name})")
        version = max(available)
        return version, available[version]


def _grpc_errors(method: Any) -> Any:
    def wrapped(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except ServingError as exc:
            context.abort(exc.code, str(exc))
    wrapped.__name__ = method.__name__
    return wrapped


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, models: Models) -> None:
        self.models = models

    @_grpc_errors
    def GetModelStatus(self, request: Any, context: Any) -> Any:
        spec = request.model_spec
        with self.models.lock:
            found = sorted((v, e) for (n, v), e in self.models.versions.items()
                           if n == spec.name and (not spec.HasField("version")
                                                  or v == spec.version.value))
        if not found:
            what = (f"version {spec.version.value} of model {spec.name}"
                    if spec.HasField("version") else f"any versions of model {spec.name}")
            raise ServingError(grpc.StatusCode.NOT_FOUND, f"Could not find {what}")
        response = get_model_status_pb2.GetModelStatusResponse()
        for version, entry in found:
            status = response.model_version_status.add(version=version, state=entry.state)
            if entry.error:
                status.status.error_code = UNKNOWN
                status.status.error_message = entry.error
        return response

    @_grpc_errors
    def HandleReloadConfigRequest(self, request: Any, context: Any) -> Any:
        errors = self.models.reload(request.config)
        if errors:
            raise ServingError(grpc.StatusCode.UNKNOWN, "; ".join(errors))
        return model_management_pb2.ReloadConfigResponse()


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, models: Models) -> None:
        self.models = models

    @_grpc_errors
    def GetModelMetadata(self, request: Any, context: Any) -> Any:
        fields = list(request.metadata_field)
        if fields != ["signature_def"]:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"Metadata field(s) {fields} not supported: signature_def only")
        version, entry = self.models.find(request.model_spec)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name, response.model_spec.version.value = \
            request.model_spec.name, version
        defs = get_model_metadata_pb2.SignatureDefMap()
        for name, sig in entry.signature_defs.items():
            defs.signature_def[name].CopyFrom(sig)
        response.metadata["signature_def"].Pack(defs)
        return response

    @_grpc_errors
    def Predict(self, request: Any, context: Any) -> Any:
        version, entry = self.models.find(request.model_spec)
        loaded = entry.loaded
        signature = request.model_spec.signature_name or "serving_default"
        if loaded is None or signature not in loaded.signatures:
            raise ServingError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"Serving signature name: {signature!r} not found in "
                               "signature def")
        fn = loaded.signatures[signature]
        specs = fn.structured_input_signature[1]
        if set(request.inputs) != set(specs):
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"input keys {sorted(request.inputs)} do not match the "
                               f"signature's {sorted(specs)}")
        feed = {}
        for key, proto in request.inputs.items():
            spec = specs[key]
            if proto.dtype != spec.dtype.as_datatype_enum:
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"input {key!r}: expects {spec.dtype.name} but "
                                   f"{tf.dtypes.as_dtype(proto.dtype).name} is provided")
            try:
                array = tf.make_ndarray(proto)
            except Exception as exc:  # noqa: BLE001
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"input {key!r}: {exc}") from None
            if not spec.shape.is_compatible_with(array.shape):
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"input {key!r}: shape {list(array.shape)} is not "
                                   f"compatible with {spec.shape}")
            feed[key] = tf.constant(array, dtype=spec.dtype)
        try:
            outputs = fn(**feed)
        except tf.errors.InvalidArgumentError as exc:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, exc.message) from None
        except Exception as exc:  # noqa: BLE001
            raise ServingError(grpc.StatusCode.INTERNAL, str(exc)) from None
        wanted = list(request.output_filter) or list(outputs)
        response = predict_pb2.PredictResponse()
        response.model_spec.name, response.model_spec.version.value = \
            request.model_spec.name, version
        response.model_spec.signature_name = signature
        for key in wanted:
            if key not in outputs:
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"output_filter names unknown output {key!r}")
            response.outputs[key].CopyFrom(tf.make_tensor_proto(outputs[key].numpy()))
        return response


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tfserving-standin",
        description="Test stand-in for tensorflow_model_server (gRPC only).")
    parser.add_argument("--port", type=int, default=8500)
    parser.add_argument("--model_config_file", required=True)
    parser.add_argument("--file_system_poll_wait_seconds", type=int, default=1)
    parser.add_argument("--max_num_load_retries", type=int, default=5)
    parser.add_argument("--tensorflow_intra_op_parallelism", type=int, default=0)
    parser.add_argument("--tensorflow_inter_op_parallelism", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s standin %(message)s")
    if args.tensorflow_intra_op_parallelism:
        tf.config.threading.set_intra_op_parallelism_threads(
            args.tensorflow_intra_op_parallelism)
    if args.tensorflow_inter_op_parallelism:
        tf.config.threading.set_inter_op_parallelism_threads(
            args.tensorflow_inter_op_parallelism)
    models = Models()
    config = text_format.Parse(Path(args.model_config_file).read_text(),
                               model_server_config_pb2.ModelServerConfig())
    if config.WhichOneof("config") is not None:
        errors = models.reload(config)
        if errors:
            print(f"Failed to start server. Error: {'; '.join(errors)}", file=sys.stderr)
            return 1
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                         options=[("grpc.max_send_message_length", -1),
                                  ("grpc.max_receive_message_length", -1)])
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(models), server)
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionService(models), server)
    if not server.add_insecure_port(f"127.0.0.1:{args.port}"):
        print(f"Failed to start server: cannot bind port {args.port}", file=sys.stderr)
        return 1
    server.start()
    print(f"Running gRPC ModelServer (test stand-in) at 127.0.0.1:{args.port} ...",
          flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=1).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
