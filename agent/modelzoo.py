"""Real ONNX models written locally, deterministically (nothing is downloaded).

``write_mlp`` builds a Gemm/Relu multilayer perceptron with the ``onnx`` helpers; its
weights come from ``numpy.random.default_rng(seed)``, so ``mlp_forward`` recomputes the
exact reference output in numpy. ``write_sklearn_classifier`` exports a scikit-learn
logistic regression through ``skl2onnx``. ``write_demo_repository`` lays out the demo
model repository ``edgeagent serve`` uses when given no repository.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

_OPSET = 17
_IR_VERSION = 8  # readable by every onnxruntime >= 1.15


def mlp_weights(
    *, inputs: int, hidden: int, layers: int, outputs: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (W, b) pairs of the MLP ``write_mlp`` writes: ``layers`` hidden layers + output."""
    if min(inputs, hidden, outputs) < 1 or layers < 0:
        raise ValueError("inputs, hidden and outputs must be >= 1 and layers >= 0")
    rng = np.random.default_rng(seed)
    dims = [inputs] + [hidden] * layers + [outputs]
    weights = []
    for fan_in, fan_out in zip(dims[:-1], dims[1:]):
        w = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        b = (rng.standard_normal(fan_out) * 0.1).astype(np.float32)
        weights.append((w, b))
    return weights


def mlp_forward(x: np.ndarray, *, inputs: int, hidden: int, layers: int, outputs: int,
                seed: int) -> np.ndarray:
    """Reference output of the MLP for ``x`` ([N, inputs] float32), computed in numpy."""
    h = np.asarray(x, dtype=np.float32)
    weights = mlp_weights(inputs=inputs, hidden=hidden, layers=layers, outputs=outputs,
                          seed=seed)
    for i, (w, b) in enumerate(weights):
        h = h @ w + b
        if i < len(weights) - 1:
            h = np.maximum(h, 0)
    return h


def mlp_param_bytes(*, inputs: int, hidden: int, layers: int, outputs: int) -> int:
    """Bytes of float32 parameters in such an MLP (≈ the model file's size)."""
    dims = [inputs] + [hidden] * layers + [outputs]
    return 4 * sum(a * b + b for a, b in zip(dims[:-1], dims[1:]))


def write_mlp(path: str | Path, *, inputs: int, hidden: int, layers: int, outputs: int,
              seed: int = 0) -> Path:
    """Write an MLP ``X [N, inputs] float32 -> Y [N, outputs] float32`` to ``path``.

    ``layers`` hidden layers of width ``hidden`` with ReLU, then a linear output layer.
    Parents of ``path`` are created. Same arguments, same bytes.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = mlp_weights(inputs=inputs, hidden=hidden, layers=layers, outputs=outputs,
                          seed=seed)
    nodes, inits = [], []
    current = "X"
    for i, (w, b) in enumerate(weights):
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"B{i}")]
        last = i == len(weights) - 1
        out = "Y" if last else f"G{i}"
        nodes.append(helper.make_node("Gemm", [current, f"W{i}", f"B{i}"], [out], name=f"gemm{i}"))
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"H{i}"], name=f"relu{i}"))
            current = f"H{i}"
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", inputs])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", outputs])],
        initializer=inits,
    )
    model = helper.make_model(graph, producer_name="edgeagent.modelzoo",
                              opset_imports=[helper.make_opsetid("", _OPSET)])
    model.ir_version = _IR_VERSION
    onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, model.SerializeToString())
    return path


def write_sklearn_classifier(path: str | Path, *, features: int = 8, classes: int = 3,
                             seed: int = 0) -> Path:
    """Train a logistic regression on generated data and export it with skl2onnx.

    Input ``X [N, features]`` float32; outputs ``label`` int64 [N] and
    ``probabilities`` float32 [N, classes] (no ZipMap, so both are plain tensors).
    """
    from skl2onnx import to_onnx
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression

    x, y = make_classification(n_samples=300, n_features=features, n_informative=features,
                               n_redundant=0, n_classes=classes, random_state=seed)
    clf = LogisticRegression(max_iter=500).fit(x.astype(np.float32), y)
    model = to_onnx(clf, x[:1].astype(np.float32), target_opset={"": _OPSET, "ai.onnx.ml": 3},
                    options={id(clf): {"zipmap": False}})
    model.ir_version = _IR_VERSION
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, model.SerializeToString())
    return path


#: ``write_echo`` inputs: name -> (ONNX element type name, OIP datatype).
ECHO_TYPES = {"f32": ("FLOAT", "FP32"), "f64": ("DOUBLE", "FP64"), "i32": ("INT32", "INT32"),
              "i64": ("INT64", "INT64"), "b": ("BOOL", "BOOL"), "s": ("STRING", "BYTES")}


def write_echo(path: str | Path) -> Path:
    """A model with one input per ``ECHO_TYPES`` entry (``in_<k>``, shape [N, -1]),
    each returned unchanged as ``out_<k>``: exercises every tensor datatype."""
    import onnx
    from onnx import TensorProto, helper

    ins, outs, nodes = [], [], []
    for key, (onnx_type, _) in ECHO_TYPES.items():
        elem = getattr(TensorProto, onnx_type)
        ins.append(helper.make_tensor_value_info(f"in_{key}", elem, ["N", "K"]))
        outs.append(helper.make_tensor_value_info(f"out_{key}", elem, ["N", "K"]))
        nodes.append(helper.make_node("Identity", [f"in_{key}"], [f"out_{key}"]))
    model = helper.make_model(helper.make_graph(nodes, "echo", ins, outs),
                              producer_name="edgeagent.modelzoo",
                              opset_imports=[helper.make_opsetid("", _OPSET)])
    model.ir_version = _IR_VERSION
    onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, model.SerializeToString())
    return path


#: The demo zoo: name -> MLP shape. Together larger than ``DEMO_BUDGET``: the demo evicts.
DEMO_MLPS: dict[str, dict[str, int]] = {
    "mlp-small": dict(inputs=64, hidden=256, layers=2, outputs=10, seed=1),
    "mlp-wide": dict(inputs=256, hidden=2048, layers=3, outputs=16, seed=2),
    "mlp-deep": dict(inputs=128, hidden=1536, layers=6, outputs=10, seed=3),
    "mlp-large": dict(inputs=512, hidden=2560, layers=3, outputs=32, seed=4),
    "mlp-medium": dict(inputs=128, hidden=1280, layers=4, outputs=8, seed=5),
}
DEMO_BUDGET = "128MB"


def write_demo_repository(root: str | Path) -> Path:
    """Create the demo model repository under ``root`` (idempotent: skips what exists)."""
    root = Path(root)
    for name, shape in DEMO_MLPS.items():
        target = root / name / "1" / "model.onnx"
        if not target.exists():
            write_mlp(target, **shape)
    target = root / "classifier" / "1" / "model.onnx"
    if not target.exists():
        write_sklearn_classifier(target)
        (root / "classifier" / "config.yaml").write_text("pin: true\n")
    synthetic = root / "synthetic-sleepy" / "config.yaml"
    if not synthetic.exists():
        synthetic.parent.mkdir(parents=True, exist_ok=True)
        synthetic.write_text(
            "backend: synthetic\n"
            "synthetic: {base_ms: 5, per_item_ms: 0.5, size_bytes: 1000000, load_ms: 200}\n"
        )
    return root


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
