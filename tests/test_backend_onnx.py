"""The ONNX Runtime backend: loader contract, session options, numerics, CUDA path."""

import numpy as np
import onnxruntime as ort
import pytest

from agent.backends.base import BackendError
from agent.backends.onnx import OnnxBackend, cuda_options, onnx_weight_bytes
from agent.config import parse_model_config
from agent.modelzoo import mlp_forward, mlp_param_bytes
from agent.memory import FootprintModel
from tests.helpers import TINY_MLP, add_mlp


def backend(repo, config=None, name="m"):
    add_mlp(repo, name)
    return OnnxBackend(name, 1, repo / name, parse_model_config(config or {}), FootprintModel())


def test_load_infer_unload(repo):
    b = backend(repo, {"onnxruntime": {"intra_op_threads": 2,
                                       "graph_optimization_level": "basic"}})
    assert b.file_bytes() > b.weight_bytes() > 0 and b.estimate() > b.lower_bound()
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


def test_estimate_is_from_the_graph_and_the_prior(repo):
    b = backend(repo, name="w")
    weights = mlp_param_bytes(**{k: v for k, v in TINY_MLP.items() if k != "seed"})
    assert b.weight_bytes() == b.lower_bound() == weights
    prior = OnnxBackend.PRIORS["cpu"]
    assert b.estimate() == int(prior.overhead + prior.factor * weights)


def test_weight_bytes_counts_typed_fields_constants_and_external_data(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.ones((256, 128), np.float32)          # raw_data: 128 KiB
    typed = helper.make_tensor("T", TensorProto.FLOAT, [64], [0.5] * 64)  # float_data
    half = helper.make_tensor("H", TensorProto.FLOAT16, [10], np.ones(10, np.float16))
    const = helper.make_node("Constant", [], ["C"],
                             value=numpy_helper.from_array(np.ones(100, np.int64)))
    graph = helper.make_graph(
        [const, helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 128])],
        initializer=[numpy_helper.from_array(w, "W"), typed, half])
    model = helper.make_model(graph)
    inline = tmp_path / "inline.onnx"
    onnx.save(model, str(inline))
    expected = w.nbytes + 64 * 4 + 10 * 2 + 100 * 8
    assert onnx_weight_bytes(inline) == expected
    external = tmp_path / "ext" / "model.onnx"
    external.parent.mkdir()
    onnx.save(model, str(external), save_as_external_data=True, location="weights.bin",
              size_threshold=1024)
    assert external.stat().st_size < 4096  # the weights are not in the protobuf
    assert onnx_weight_bytes(external) == expected
    with pytest.raises(ValueError, match="not an ONNX model"):
        (tmp_path / "bad.onnx").write_bytes(b"\xff\xff not a model")
        onnx_weight_bytes(tmp_path / "bad.onnx")


def test_a_broken_file_is_a_backend_error_at_estimate(repo):
    (repo / "bad" / "1").mkdir(parents=True)
    (repo / "bad" / "1" / "model.onnx").write_bytes(b"\xff\xff not a model")
    b = OnnxBackend("bad", 1, repo / "bad", parse_model_config({}), FootprintModel())
    with pytest.raises(BackendError, match="cannot load"):
        b.estimate()


def test_cuda_sessions_ask_for_exact_arena_growth_and_a_limit():
    assert cuda_options("cuda:1") == {"device_id": "1",
                                      "arena_extend_strategy": "kSameAsRequested"}
    assert cuda_options("cuda:0", 3 * 2**30)["gpu_mem_limit"] == str(3 * 2**30)


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


def test_trivial_model_is_what_onnx_helper_builds():
    """The priming model is spelled out as bytes (the agent never imports onnx): it must be
    the Identity model onnx.helper makes, and run."""
    from onnx import TensorProto, helper

    from agent.backends.onnx import TRIVIAL_MODEL

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "prime",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    assert model.SerializeToString() == TRIVIAL_MODEL
    session = ort.InferenceSession(TRIVIAL_MODEL, providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.array([2.5], np.float32)})[0].tolist() == [2.5]
