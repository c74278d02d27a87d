"""ONNX Runtime backend: CPU execution provider, or CUDA where onnxruntime-gpu and a GPU
are present (GPU memory then measured with NVML around the load)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from typing import Any

import numpy as np

from agent.backends.base import Backend, BackendError, InvalidInput, TensorSpec

_ORT_TYPES = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(int8)": "INT8",
    "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
    "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}


def _spec(arg: Any) -> TensorSpec:
    dtype = _ORT_TYPES.get(arg.type)
    if dtype is None:
        raise BackendError(f"tensor {arg.name!r} has unsupported type {arg.type}")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
    return TensorSpec(arg.name, dtype, shape)


def prime_runtime() -> None:
    """Create and run one trivial session so that ONNX Runtime's one-time set-up (~10 MB
    of environment, thread pools, allocators) is not billed to the first model loaded."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "prime",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"])
    session.run(None, {"x": np.zeros(1, np.float32)})


def _answer(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    """On the event loop: the outcome of a job run by ``OnnxBackend.infer_async``
    (dropped when the awaiting request was cancelled meanwhile)."""
    if future.cancelled():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


class OnnxBackend(Backend):
    kind = "onnx"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.session = None
        self._gpu_bytes: int | None = None

    @property
    def model_file(self):
        return self.path / str(self.version) / "model.onnx"

    def file_bytes(self) -> int:
        return self.model_file.stat().st_size

    def estimate(self) -> int:
        try:
            return self.footprints.estimate(self.kind, self.file_bytes())
        except OSError as exc:
            raise BackendError(f"cannot read {self.model_file}: {exc.strerror}") from None

    def _session_options(self):
        import onnxruntime as ort

        opts = self.config.onnxruntime
        so = ort.SessionOptions()
        so.intra_op_num_threads = opts.intra_op_threads
        so.inter_op_num_threads = opts.inter_op_threads
        so.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[opts.graph_optimization_level]
        so.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if opts.execution_mode == "parallel"
                             else ort.ExecutionMode.ORT_SEQUENTIAL)
        so.enable_cpu_mem_arena = opts.enable_cpu_mem_arena
        so.enable_mem_pattern = opts.enable_mem_pattern
        so.add_session_config_entry("session.intra_op.allow_spinning",
                                    "1" if opts.allow_spinning else "0")
        return so

    def _providers(self) -> list:
        import onnxruntime as ort

        if self.device == "cpu":
            return ["CPUExecutionProvider"]
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise BackendError(f"model {self.name!r} asks for {self.device} but onnxruntime "
                               "has no CUDA execution provider (install onnxruntime-gpu)")
        index = int(self.device.split(":")[1])
        return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]

    def load(self) -> None:
        import onnxruntime as ort

        from agent.memory import gpu_used_bytes

        providers = self._providers()
        gpu_before = gpu_used_bytes(self.device) if self.device != "cpu" else None
        try:
            session = ort.InferenceSession(str(self.model_file), self._session_options(),
                                           providers=providers)
        except Exception as exc:  # noqa: BLE001 - ORT raises several unrelated types
            raise BackendError(f"onnxruntime cannot load {self.model_file}: {exc}") from None
        inputs = [_spec(a) for a in session.get_inputs()]
        outputs = [_spec(a) for a in session.get_outputs()]
        warm = {s.name: self._zeros(s) for s in inputs}
        start = time.perf_counter()
        try:
            session.run(None, warm)
        except Exception as exc:  # noqa: BLE001
            raise BackendError(f"warm-up run of {self.model_file} failed: {exc}") from None
        self.first_run_seconds = time.perf_counter() - start
        if gpu_before is not None:
            after = gpu_used_bytes(self.device)
            self._gpu_bytes = max(after - gpu_before, 0) if after is not None else None
        self.session, self.inputs, self.outputs = session, inputs, outputs

    @staticmethod
    def _zeros(spec: TensorSpec) -> np.ndarray:
        shape = [d if d >= 0 else 1 for d in spec.shape]
        if spec.datatype == "BYTES":
            return np.full(shape, "", dtype=object)
        from agent.backends.base import DATATYPES

        return np.zeros(shape, DATATYPES[spec.datatype])

    def measured_bytes(self) -> int | None:
        return self._gpu_bytes if self.device != "cpu" else None

    def infer(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any]
              ) -> dict[str, np.ndarray]:
        session = self.session
        if session is None:
            raise BackendError(f"model {self.name!r} is not loaded")
        feed = {k: (self._to_str(k, v) if v.dtype == object else v) for k, v in inputs.items()}
        try:
            results = session.run(None, feed)
        except Exception as exc:  # noqa: BLE001
            name = type(exc).__name__
            if "InvalidArgument" in name or "Fail" in name:
                raise InvalidInput(str(exc)) from None
            raise BackendError(f"onnxruntime failed on {self.name!r}: {exc}") from None
        return {spec.name: (self._to_bytes(value) if value.dtype == object else value)
                for spec, value in zip(self.outputs, results)}

    async def infer_async(self, inputs: dict[str, np.ndarray], parameters: dict[str, Any],
                          executor: Executor | None) -> dict[str, np.ndarray]:
        """``infer`` in ``executor``, as ``run_in_executor`` would run it, with a lighter
        hand-off back: the worker thread answers an asyncio future through one
        ``call_soon_threadsafe`` (no concurrent future chained to it)."""
        if executor is None:
            return await super().infer_async(inputs, parameters, executor)
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def job() -> None:
            try:
                result = self.infer(inputs, parameters)
            except BaseException as exc:  # noqa: BLE001 - the caller's answer
                loop.call_soon_threadsafe(_answer, future, None, exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                loop.call_soon_threadsafe(_answer, future, result, None)

        executor.submit(job)
        return await future

    @staticmethod
    def _to_str(name: str, array: np.ndarray) -> np.ndarray:
        """ONNX string tensors hold text: BYTES elements must be UTF-8."""
        try:
            return np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else str(b),
                                otypes=[object])(array) if array.size else array
        except UnicodeDecodeError:
            raise InvalidInput(f"input {name!r}: BYTES elements must be UTF-8 text for "
                               "an ONNX string tensor") from None

    @staticmethod
    def _to_bytes(array: np.ndarray) -> np.ndarray:
        return np.vectorize(lambda s: s.encode() if isinstance(s, str) else s,
                            otypes=[object])(array) if array.size else array

    def unload(self) -> None:
        self.session = None
