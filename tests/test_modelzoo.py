"""The model zoo writes real, deterministic ONNX models that ONNX Runtime runs."""

import numpy as np
import onnxruntime as ort

from agent.modelzoo import (mlp_forward, mlp_param_bytes, write_mlp,
                            write_sklearn_classifier)

SHAPE = dict(inputs=8, hidden=32, layers=2, outputs=3, seed=7)


def test_mlp_matches_numpy_reference(tmp_path):
    path = write_mlp(tmp_path / "m" / "1" / "model.onnx", **SHAPE)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    (y,) = sess.run(None, {"X": x})
    assert y.shape == (5, 3)
    np.testing.assert_allclose(y, mlp_forward(x, **SHAPE), rtol=1e-4, atol=1e-5)


def test_mlp_is_deterministic_and_sized(tmp_path):
    a = write_mlp(tmp_path / "a.onnx", **SHAPE).read_bytes()
    b = write_mlp(tmp_path / "b.onnx", **SHAPE).read_bytes()
    c = write_mlp(tmp_path / "c.onnx", **{**SHAPE, "seed": 8}).read_bytes()
    assert a == b and a != c
    params = mlp_param_bytes(inputs=8, hidden=32, layers=2, outputs=3)
    assert params <= len(a) < params + 4096


def test_sklearn_classifier_outputs_plain_tensors(tmp_path):
    path = write_sklearn_classifier(tmp_path / "clf.onnx", features=4, classes=3)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.zeros((2, 4), np.float32)
    label, proba = sess.run(None, {sess.get_inputs()[0].name: x})
    assert label.shape == (2,) and proba.shape == (2, 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)


def test_echo_model_round_trips_every_datatype(tmp_path):
    from agent.modelzoo import ECHO_TYPES, write_echo

    sess = ort.InferenceSession(str(write_echo(tmp_path / "e.onnx")),
                                providers=["CPUExecutionProvider"])
    feed = {"in_f32": np.ones((1, 2), np.float32), "in_f64": np.ones((1, 2)),
            "in_i32": np.ones((1, 2), np.int32), "in_i64": np.ones((1, 2), np.int64),
            "in_b": np.ones((1, 2), bool), "in_s": np.array([["a", "b"]], dtype=object)}
    outs = sess.run(None, feed)
    assert len(outs) == len(ECHO_TYPES)
    for (key, value), out in zip(feed.items(), outs):
        assert out.tolist() == value.tolist()
