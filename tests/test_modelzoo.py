"""The model zoo writes real, deterministic ONNX models that ONNX Runtime runs, encoded
without the onnx package (agent/onnxfile.py) exactly as the onnx package encodes them."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from agent.modelzoo import (classifier_weights, mlp_forward, mlp_param_bytes,
                            write_classifier, write_demo_repository, write_echo, write_mlp)

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


def test_classifier_outputs_plain_tensors_and_learned_its_clusters(tmp_path):
    path = write_classifier(tmp_path / "clf.onnx", features=4, classes=3)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    _, _, x, y = classifier_weights(features=4, classes=3, seed=0)
    label, proba = sess.run(None, {sess.get_inputs()[0].name: x})
    assert label.shape == (len(x),) and proba.shape == (len(x), 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)
    assert label.tolist() == proba.argmax(axis=1).tolist()
    assert (label == y).mean() > 0.9  # the clusters were learned, not a constant answer


@pytest.mark.parametrize("write", [
    lambda path: write_mlp(path, **SHAPE), write_classifier, write_echo])
def test_files_are_valid_canonical_onnx(tmp_path, write):
    """The onnx package's full checker takes each file, and reads it back to the very
    bytes it would write itself (field order, packing and all)."""
    data = write(tmp_path / "m.onnx").read_bytes()
    model = onnx.load_model_from_string(data)
    onnx.checker.check_model(model, full_check=True)
    assert model.SerializeToString() == data
    assert model.producer_name == "edgeagent.modelzoo" and model.ir_version == 8


def test_demo_repository_answers_as_its_references(tmp_path):
    """The demo the lean install writes: every MLP answers as its numpy reference, and
    writing it again gives the same bytes."""
    from agent.modelzoo import DEMO_MLPS

    root = write_demo_repository(tmp_path / "demo")
    again = write_demo_repository(tmp_path / "again")
    for path in sorted(root.rglob("*.onnx")):
        assert path.read_bytes() == (again / path.relative_to(root)).read_bytes(), path
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    shape = DEMO_MLPS["mlp-small"]
    sess = ort.InferenceSession(str(root / "mlp-small" / "1" / "model.onnx"),
                                providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"X": x})[0], mlp_forward(x, **shape),
                               rtol=1e-4, atol=1e-5)


def test_echo_model_round_trips_every_datatype(tmp_path):
    from agent.modelzoo import ECHO_TYPES

    sess = ort.InferenceSession(str(write_echo(tmp_path / "e.onnx")),
                                providers=["CPUExecutionProvider"])
    feed = {"in_f32": np.ones((1, 2), np.float32), "in_f64": np.ones((1, 2)),
            "in_i32": np.ones((1, 2), np.int32), "in_i64": np.ones((1, 2), np.int64),
            "in_b": np.ones((1, 2), bool), "in_s": np.array([["a", "b"]], dtype=object)}
    outs = sess.run(None, feed)
    assert len(outs) == len(ECHO_TYPES)
    for (key, value), out in zip(feed.items(), outs):
        assert out.tolist() == value.tolist()
