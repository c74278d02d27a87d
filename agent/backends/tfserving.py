"""TensorFlow Serving backend: SavedModels served by one shared ``tensorflow_model_server``.

``TfServingHost`` is the node's one server (managed or attached, see
``tfserving_process``) and the model set it should hold. TF Serving replaces its whole
model list on every ``HandleReloadConfigRequest``, so loading or unloading one model
sends the full desired list, then polls ``GetModelStatus`` until that version is
AVAILABLE (load) or END (unload). Reloads run one at a time: each load's memory is the
server's RSS delta around it (NVML for GPU models), which only means something when
nothing else changes in the server meanwhile. Inference (``Predict``) runs concurrently
and never waits for a reload.

``TfServingBackend`` is one model version on that host, behind the common loader
interface. Faults: a managed server that dies is restarted with backoff and given the
resident set back; requests meanwhile get ``BackendUnavailable`` (503). A model that
does not load is taken out of the list again and its load fails with the server's reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from agent.backends.base import (Backend, BackendError, BackendUnavailable,
                                 InvalidInput, TensorSpec)
from agent.memory import GpuMemoryReader, MiB, Prior
from agent.backends.tfserving_protos import (Protos, from_tensor_proto, oip_datatype,
                                             protos, to_tensor_proto)

if TYPE_CHECKING:
    from agent.config import TfServingSettings

log = logging.getLogger("edgeagent.tfserving")

AVAILABLE, END = "AVAILABLE", "END"
DEFAULT_SIGNATURE = "serving_default"


def _rpc_code(exc: Exception) -> str | None:
    code = getattr(exc, "code", None)
    try:
        return code().name if callable(code) else None
    except Exception:  # noqa: BLE001 - not a grpc.Call
        return None


def _rpc_details(exc: Exception) -> str:
    details = getattr(exc, "details", None)
    with contextlib.suppress(Exception):
        return (details() if callable(details) else None) or str(exc)
    return str(exc)


class TfServingHost:
    """The node's one TF Serving server and the set of model versions it should hold.
    Cheap to create: nothing is imported or started before the first TF model loads."""

    POLL_MAX = 0.2  # seconds between GetModelStatus polls, at most

    def __init__(self, settings: "TfServingSettings", workdir: Path, *,
                 gpu_reader: GpuMemoryReader | None = None) -> None:
        self.settings = settings
        self.workdir = Path(workdir)
        self.gpu_reader = gpu_reader or GpuMemoryReader()
        self._server: Any = None
        self._server_lock = threading.Lock()
        #: (name, version) → model base path (the directory holding the version dirs).
        self._desired: dict[tuple[str, int], Path] = {}
        #: Models a restart could not bring back, with the server's reason.
        self.lost: dict[tuple[str, int], str] = {}
        self._reload_lock = threading.RLock()  # one reload + status wait at a time
        self._restoring = False
        self._stubs: tuple[int, Any, Any] | None = None
        self._closed = False

    # -- the server ----------------------------------------------------------------------
    @property
    def p(self) -> Protos:
        return protos()

    @property
    def server(self) -> Any:
        with self._server_lock:
            if self._closed:
                raise BackendUnavailable("TF Serving is shut down (the agent is stopping)")
            if self._server is None:
                self.p  # noqa: B018 - fail early, with the install hint
                from agent.backends.tfserving_process import AttachedServer, ManagedServer

                s = self.settings
                if s.address:
                    server: Any = AttachedServer(s.address,
                                                 start_timeout=s.start_timeout_seconds)
                else:
                    server = ManagedServer(
                        s.binary, self.workdir, port=s.grpc_port, args=s.args,
                        start_timeout=s.start_timeout_seconds,
                        backoff=s.restart_backoff_seconds,
                        backoff_max=s.restart_backoff_max_seconds)
                server.on_started = self._restore
                self._server = server
            return self._server

    def ensure_up(self) -> None:
        self.server.ensure_up()

    def _stubs_now(self) -> tuple[Any, Any]:
        """(ModelService, PredictionService) stubs on the current channel."""
        server = self.server
        cached = self._stubs
        if cached is None or cached[0] != server.generation:
            p = self.p
            cached = (server.generation, p.model_service.ModelServiceStub(server.channel),
                      p.prediction_service.PredictionServiceStub(server.channel))
            self._stubs = cached
        return cached[1], cached[2]

    def _check_serving(self) -> None:
        """``BackendUnavailable`` unless the server is up and not restoring."""
        server = self.server
        if not server.up:
            raise BackendUnavailable(f"{server.describe_down()}; retry shortly")
        if self._restoring:
            raise BackendUnavailable("TF Serving is getting its models back after a "
                                     "restart; retry shortly")

    def pid(self) -> int | None:
        return self.server.pid() if self._server is not None else None

    def close(self) -> None:
        """Stop a managed server, close the channel (agent shutdown)."""
        with self._server_lock:
            self._closed = True
            server, self._server = self._server, None
        if server is not None:
            server.close()

    # -- the model list ------------------------------------------------------------------
    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold off other reloads (a load measures the server's memory around itself)."""
        with self._reload_lock:
            yield

    def desired(self) -> dict[tuple[str, int], Path]:
        with self._reload_lock:
            return dict(self._desired)

    def _base_path(self, path: Path) -> str:
        """A model directory as the server sees it (``model_base_path`` maps the repo)."""
        if self.settings.model_base_path:
            return f"{self.settings.model_base_path.rstrip('/')}/{path.name}"
        return str(Path(path).resolve())

    def server_config(self) -> Any:
        """The full ModelServerConfig for the desired set: one entry per model name, its
        loaded versions pinned with a ``specific`` version policy."""
        p = self.p
        config = p.server_config.ModelServerConfig()
        config.model_config_list.SetInParent()
        by_name: dict[str, tuple[Path, list[int]]] = {}
        for (name, version), path in sorted(self._desired.items()):
            by_name.setdefault(name, (path, []))[1].append(version)
        for name, (path, versions) in by_name.items():
            entry = config.model_config_list.config.add(
                name=name, base_path=self._base_path(path), model_platform="tensorflow")
            entry.model_version_policy.specific.versions.extend(versions)
        return config

    def _reload(self, timeout: float) -> str | None:
        """Send the desired list; the server's error message, if it reported one."""
        model_stub, _ = self._stubs_now()
        request = self.p.management.ReloadConfigRequest(config=self.server_config())
        try:
            response = model_stub.HandleReloadConfigRequest(request, timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - grpc.RpcError
            code = _rpc_code(exc)
            if code in ("UNAVAILABLE", "CANCELLED"):
                raise BackendUnavailable(f"TF Serving went away during a reload: "
                                         f"{_rpc_details(exc)}") from None
            if code is None:
                raise
            return f"{code}: {_rpc_details(exc)}"
        if response.status.error_code:
            return response.status.error_message or f"error code {response.status.error_code}"
        return None

    def _version_state(self, name: str, version: int) -> tuple[str | None, str]:
        """(state name or None if the server does not know the version, error message)."""
        model_stub, _ = self._stubs_now()
        p = self.p
        request = p.status.GetModelStatusRequest()
        request.model_spec.name = name
        request.model_spec.version.value = version
        try:
            response = model_stub.GetModelStatus(request, timeout=10)
        except Exception as exc:  # noqa: BLE001 - grpc.RpcError
            code = _rpc_code(exc)
            if code == "NOT_FOUND":
                return None, ""
            if code in ("UNAVAILABLE", "CANCELLED"):
                raise BackendUnavailable(f"TF Serving went away while {name}:{version} was "
                                         f"changing: {_rpc_details(exc)}") from None
            raise BackendError(f"GetModelStatus({name}:{version}) failed: "
                               f"{code}: {_rpc_details(exc)}") from None
        for status in response.model_version_status:
            if status.version == version:
                state = p.status.ModelVersionStatus.State.Name(status.state)
                return state, status.status.error_message
        return None, ""

    def wait_for(self, name: str, version: int, want: str, timeout: float,
                 reload_error: str | None = None) -> None:
        """Poll until ``name:version`` is ``want`` (AVAILABLE or END). A load that ends in
        END, or a timeout, is a ``BackendError`` with the server's reason."""
        deadline = time.monotonic() + timeout
        pause = 0.005
        state: str | None = None
        while True:
            state, error = self._version_state(name, version)
            if want == END and state in (None, END):
                return
            if want == AVAILABLE:
                if state == AVAILABLE:
                    return
                if state == END:
                    reason = error or reload_error or "no reason given"
                    raise BackendError(f"TF Serving could not load {name}:{version}: {reason}")
                if state is None and reload_error:
                    raise BackendError(f"TF Serving could not load {name}:{version}: "
                                       f"{reload_error}")
            if time.monotonic() >= deadline:
                what = "become AVAILABLE" if want == AVAILABLE else "unload"
                raise BackendError(f"TF Serving did not {what} {name}:{version} within "
                                   f"{timeout:g} s (state: {state or 'unknown'})")
            time.sleep(pause)
            pause = min(pause * 2, self.POLL_MAX)

    def add(self, name: str, version: int, path: Path) -> None:
        """Load ``name:version`` by a reload with the full list; wait until AVAILABLE.
        On failure the model leaves the list again and ``BackendError`` says why."""
        timeout = self.settings.load_timeout_seconds
        with self._reload_lock:
            self.lost.pop((name, version), None)
            self._desired[(name, version)] = Path(path)
            try:
                error = self._reload(timeout)
                self.wait_for(name, version, AVAILABLE, timeout, error)
            except BaseException:
                self._desired.pop((name, version), None)
                with contextlib.suppress(Exception):
                    self._reload(self.settings.unload_timeout_seconds)
                raise

    def remove(self, name: str, version: int) -> None:
        """Unload ``name:version`` by a reload without it; wait until END."""
        timeout = self.settings.unload_timeout_seconds
        with self._reload_lock:
            if self._desired.pop((name, version), None) is None:
                return
            server = self.server
            if not server.up:
                return  # it restarts without this model
            error = self._reload(timeout)
            if error:
                log.warning("TF Serving reported on unloading %s:%s: %s", name, version, error)
            self.wait_for(name, version, END, timeout)

    def _restore(self) -> None:
        """Give a (re)started server the desired list back; models that fail are dropped
        into ``lost`` with the reason. Runs before the server counts as up."""
        with self._reload_lock:
            if not self._desired:
                return
            self._restoring = True
            try:
                log.info("restoring %d model version(s) on TF Serving", len(self._desired))
                error = self._reload(self.settings.load_timeout_seconds)
                dropped = False
                for key in sorted(self._desired):
                    try:
                        self.wait_for(*key, AVAILABLE, self.settings.load_timeout_seconds,
                                      error)
                    except BackendUnavailable:
                        raise
                    except BackendError as exc:
                        log.error("restore: %s", exc)
                        self.lost[key] = str(exc)
                        del self._desired[key]
                        dropped = True
                if dropped:  # the server's list should not keep failed entries
                    self._reload(self.settings.unload_timeout_seconds)
            finally:
                self._restoring = False

    def _restore_later(self) -> None:
        """Restore in the background (an attached server that lost our models)."""
        def run() -> None:
            with contextlib.suppress(Exception):
                self._restore()

        if not self._restoring:
            threading.Thread(target=run, daemon=True, name="tfserving-restore").start()

    # -- memory --------------------------------------------------------------------------
    def memory(self, device: str) -> int | None:
        """The server's bytes in ``device``'s pool now: RSS for ``cpu``, NVML for
        ``cuda:N`` (its own processes' usage, else the device's); None if unknown."""
        pid = self.pid()
        if device == "cpu":
            if pid is None:
                return None
            import psutil

            try:
                return psutil.Process(pid).memory_info().rss
            except psutil.Error:
                return None
        return self.gpu_reader.used(device, pid)

    # -- inference -----------------------------------------------------------------------
    def signature(self, name: str, version: int) -> tuple[str, list[TensorSpec],
                                                           list[TensorSpec]]:
        """(signature name, inputs, outputs) from ``GetModelMetadata``'s signature_def."""
        p = self.p
        _, predict_stub = self._stubs_now()
        request = p.metadata.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = name
        request.model_spec.version.value = version
        try:
            response = predict_stub.GetModelMetadata(request, timeout=30)
        except Exception as exc:  # noqa: BLE001 - grpc.RpcError
            raise self._rpc_failure(exc, name, version) from None
        defs = p.metadata.SignatureDefMap()
        if "signature_def" not in response.metadata or \
                not response.metadata["signature_def"].Unpack(defs):
            raise BackendError(f"TF Serving gave no signature_def for {name}:{version}")
        names = [n for n in defs.signature_def if not n.startswith("__")]
        chosen = DEFAULT_SIGNATURE if DEFAULT_SIGNATURE in names else (
            names[0] if len(names) == 1 else None)
        if chosen is None:
            raise BackendError(f"{name}:{version} has no {DEFAULT_SIGNATURE!r} signature "
                               f"and several others ({', '.join(sorted(names)) or 'none'})")
        sig = defs.signature_def[chosen]
        return (chosen, [self._spec(name, k, v) for k, v in sorted(sig.inputs.items())],
                [self._spec(name, k, v) for k, v in sorted(sig.outputs.items())])

    def _spec(self, model: str, key: str, info: Any) -> TensorSpec:
        if info.WhichOneof("encoding") not in (None, "name"):
            raise BackendError(f"{model}: tensor {key!r} is sparse or composite; only dense "
                               "tensors are served")
        if info.tensor_shape.unknown_rank:
            raise BackendError(f"{model}: tensor {key!r} has unknown rank; the Open "
                               "Inference Protocol needs a rank")
        shape = tuple(d.size if d.size >= 0 else -1 for d in info.tensor_shape.dim)
        return TensorSpec(key, oip_datatype(self.p, info.dtype), shape)

    def predict_request(self, name: str, version: int, signature: str,
                        inputs: dict[str, np.ndarray]) -> Any:
        p = self.p
        request = p.predict.PredictRequest()
        request.model_spec.name = name
        request.model_spec.version.value = version
        request.model_spec.signature_name = signature
        for key, array in inputs.items():
            request.inputs[key].CopyFrom(to_tensor_proto(p, key, array))
        return request

    def decode(self, response: Any, outputs: list[TensorSpec]) -> dict[str, np.ndarray]:
        missing = [o.name for o in outputs if o.name not in response.outputs]
        if missing:
            raise BackendError(f"TF Serving's response lacks output(s) {', '.join(missing)}")
        return {o.name: from_tensor_proto(self.p, o.name, response.outputs[o.name])
                for o in outputs}

    def predict(self, name: str, version: int, signature: str,
                inputs: dict[str, np.ndarray], outputs: list[TensorSpec]
                ) -> dict[str, np.ndarray]:
        """One ``Predict`` call (blocking)."""
        self._check_model(name, version)
        _, predict_stub = self._stubs_now()
        request = self.predict_request(name, version, signature, inputs)
        try:
            response = predict_stub.Predict(request,
                                            timeout=self.settings.request_timeout_seconds)
        except Exception as exc:  # noqa: BLE001 - grpc.RpcError
            raise self._rpc_failure(exc, name, version) from None
        return self.decode(response, outputs)

    async def predict_async(self, name: str, version: int, signature: str,
                            inputs: dict[str, np.ndarray], outputs: list[TensorSpec]
                            ) -> dict[str, np.ndarray]:
        """``predict`` on gRPC's own threads: no executor thread waits for the reply."""
        self._check_model(name, version)
        _, predict_stub = self._stubs_now()
        request = self.predict_request(name, version, signature, inputs)
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        call = predict_stub.Predict.future(request,
                                           timeout=self.settings.request_timeout_seconds)

        def settle() -> None:
            if not done.done():
                done.set_result(None)

        def on_done(_: Any) -> None:  # on a gRPC thread
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle)

        call.add_done_callback(on_done)
        try:
            await done
        except asyncio.CancelledError:
            call.cancel()
            raise
        try:
            response = call.result()
        except Exception as exc:  # noqa: BLE001 - grpc.RpcError
            raise self._rpc_failure(exc, name, version) from None
        return self.decode(response, outputs)

    def _check_model(self, name: str, version: int) -> None:
        if (name, version) in self.lost:
            raise BackendError(f"model {name}:{version} was lost when TF Serving restarted: "
                               f"{self.lost[(name, version)]}")
        self._check_serving()

    def _rpc_failure(self, exc: Exception, name: str, version: int) -> Exception:
        """The backend error for a failed Predict / GetModelMetadata."""
        code = _rpc_code(exc)
        details = _rpc_details(exc)
        if code == "INVALID_ARGUMENT":
            return InvalidInput(f"TF Serving rejected the input for {name}: {details}")
        if code in ("UNAVAILABLE", "CANCELLED"):
            return BackendUnavailable(f"TF Serving is unavailable ({details}); retry shortly")
        if code == "NOT_FOUND" and (name, version) in self.desired():
            self._restore_later()  # the server lost it (restarted behind our back?)
            return BackendUnavailable(f"TF Serving does not hold {name}:{version} now; "
                                      "restoring it, retry shortly")
        if code == "DEADLINE_EXCEEDED":
            return BackendError(f"TF Serving did not answer for {name} within "
                                f"{self.settings.request_timeout_seconds:g} s")
        return BackendError(f"TF Serving failed on {name}:{version}: {code}: {details}")


def saved_model_bytes(version_dir: Path) -> int:
    """Bytes of a SavedModel on disk: saved_model.pb, variables/, assets/."""
    total = 0
    for root, _, files in os.walk(version_dir):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, f)).st_size
    return total


class TfServingBackend(Backend):
    """One SavedModel version served by the node's TF Serving (``TfServingHost``)."""

    kind = "tfserving"
    MODEL_FILE = "saved_model.pb"
    # A SavedModel's runtime footprint is several times its files (graph, kernels,
    # per-model allocator); learned from the server's memory around each load.
    PRIORS = {"cpu": Prior(4.0, 64 * MiB), "cuda": Prior(4.0, 64 * MiB)}

    @classmethod
    def create(cls, name: str, version: int, path: Path, config: Any, footprints: Any, *,
               tfserving: TfServingHost | None = None, gpu: Any = None) -> "TfServingBackend":
        if tfserving is None:
            raise BackendError("backend tfserving needs the agent's TF Serving server; "
                               "this process was given none")
        return cls(name, version, path, config, footprints, tfserving)

    def __init__(self, name: str, version: int, path: Path, config: Any, footprints: Any,
                 host: TfServingHost) -> None:
        super().__init__(name, version, path, config, footprints)
        self.host = host
        self.signature_name = DEFAULT_SIGNATURE
        self._loaded = False
        self._measured: int | None = None

    @property
    def version_dir(self) -> Path:
        return self.path / str(self.version)

    def file_bytes(self) -> int:
        return saved_model_bytes(self.version_dir)

    def weight_bytes(self) -> int:
        """The SavedModel's bytes on disk (graph, variables, assets)."""
        return self.file_bytes()

    def lower_bound(self) -> int:
        """The variables' bytes: the weights, at least, must be held."""
        return saved_model_bytes(self.version_dir / "variables")

    def estimate(self) -> int:
        if not (self.version_dir / "saved_model.pb").is_file():
            raise BackendError(f"{self.version_dir} holds no saved_model.pb")
        return super().estimate()

    def load(self) -> None:
        host = self.host
        host.ensure_up()
        with host.exclusive():
            before = host.memory(self.device)
            host.add(self.name, self.version, self.path)
            try:
                self.signature_name, self.inputs, self.outputs = host.signature(
                    self.name, self.version)
                self._loaded = True  # for the warm-up's Predict
                self.warm_up()
                after = host.memory(self.device)
            except BaseException:
                self._loaded = False
                with contextlib.suppress(Exception):
                    host.remove(self.name, self.version)
                raise
        self._loaded = True
        self._measured = self._account(before, after)

    def _account(self, before: int | None, after: int | None) -> int:
        """The footprint to bill: the server's memory delta, at least the SavedModel's
        size (weights must be somewhere; RSS can shrink by chance); the estimate when
        the server's memory cannot be read (a remote server, no NVML). The first model
        after a server start also carries the runtime's one-time set-up."""
        size = self.file_bytes()
        if before is None or after is None:
            log.info("%s:%s: TF Serving's memory is not measurable here; billing the "
                     "estimate", self.name, self.version)
            return self.estimate()
        delta = after - before
        if self.device == "cpu" and delta > 0:
            self.footprints.observe(self.kind, size, delta)
        return max(delta, size)

    def measured_bytes(self) -> int | None:
        return self._measured

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]
              ) -> dict[str, np.ndarray]:
        if not self._loaded:
            raise BackendError(f"model {self.name!r} is not loaded")
        return self.host.predict(self.name, self.version, self.signature_name, inputs,
                                 self.outputs)

    async def infer_async(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any],
                          executor: Executor | None) -> dict[str, np.ndarray]:
        if not self._loaded:
            raise BackendError(f"model {self.name!r} is not loaded")
        return await self.host.predict_async(self.name, self.version, self.signature_name,
                                             inputs, self.outputs)

    def unload(self) -> None:
        """Take the version out of the server's list (also after a failed load)."""
        self._loaded = False
        try:
            self.host.remove(self.name, self.version)
        except BackendUnavailable:
            pass  # the server is down: it restarts without this model
