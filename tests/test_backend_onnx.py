"""The ONNX Runtime backend: loader contract, session options, numerics, CUDA path."""

import numpy as np
import onnxruntime as ort
import pytest

from agent.backends.base import BackendError
from agent.backends.onnx import OnnxBackend
from agent.config import parse_model_config
from agent.modelzoo import mlp_forward
from agent.memory import FootprintModel
from tests.conftest import TINY_MLP, add_mlp


def backend(repo, config=None, name="m"):
    add_mlp(repo, name)
    return OnnxBackend(name, 1, repo / name, parse_model_config(config or {}), FootprintModel())


def test_load_infer_unload(repo):
    b = backend(repo, {"onnxruntime": {"intra_op_threads": 2,
                                       "graph_optimization_level": "basic"}})
    assert b.estimate() >= b.file_bytes()
    b.load()
    assert [s.as_json() for s in b.inputs] == [{"name": "X", "datatype": "FP32",
                                                "shape": [-1, 4]}]
    assert b.first_run_seconds > 0
    opts = b.session.get_session_options()
    assert opts.intra_op_num_threads == 2
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(b.infer({"X": x}, {})["Y"], mlp_forward(x, **TINY_MLP),
                               rtol=1e-4, atol=1e-5)
    b.unload()
    with pytest.raises(BackendError, match="not loaded"):
        b.infer({"X": x}, {})


def test_footprint_factor_is_learned_as_an_upper_bound():
    f = FootprintModel()
    assert f.estimate("onnx", 10 * 2**20) == 2 * 2**20 + 20 * 2**20
    f.observe("onnx", 100, 10_000)  # tiny models teach nothing about the factor
    assert f.factor("onnx") == 2.0
    f.observe("onnx", 10 * 2**20, 12 * 2**20)
    f.observe("onnx", 20 * 2**20, 22 * 2**20)
    assert f.factor("onnx") == pytest.approx(1.2 * 1.1)
    assert f.estimate("onnx", 10 * 2**20) > 12 * 2**20
    assert FootprintModel(f.to_json()).factor("onnx") == f.factor("onnx")


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(),
                    reason="a CUDA execution provider is present; the GPU test covers it")
def test_cuda_without_cuda_ep_is_a_clear_error(repo):
    b = backend(repo, {"device": "cuda"})
    with pytest.raises(BackendError, match="no CUDA execution provider"):
        b.load()


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                    reason="GPU path: needs onnxruntime-gpu and an NVIDIA GPU (absent here)")
def test_cuda_backend_runs_and_measures_gpu_memory(repo):  # pragma: no cover - no GPU here
    b = backend(repo, {"device": "cuda:0"})
    b.load()
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(b.infer({"X": x}, {})["Y"], mlp_forward(x, **TINY_MLP),
                               rtol=1e-3, atol=1e-4)
    assert b.measured_bytes() is not None
    b.unload()
