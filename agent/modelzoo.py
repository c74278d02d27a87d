"""Real ONNX models written locally, deterministically (nothing is downloaded).

``write_mlp`` builds a Gemm/Relu multilayer perceptron; its weights come from
``numpy.random.default_rng(seed)``, so ``mlp_forward`` recomputes the exact reference
output in numpy. ``write_classifier`` writes a softmax regression trained in numpy on
generated clusters. ``write_demo_repository`` lays out the demo model repository
``edgeagent serve`` uses when given no repository. The files are encoded by
``agent.onnxfile``: the default install writes them without the ``onnx`` package.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent import onnxfile

_OPSET = 17
_IR_VERSION = 8  # readable by every onnxruntime >= 1.15
_FLOAT = onnxfile.ELEM_TYPES["float32"]


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
                seed: int, repeat: int = 1) -> np.ndarray:
    """Reference output of the MLP for ``x`` ([N, inputs] float32), computed in numpy."""
    h = np.asarray(x, dtype=np.float32)
    weights = mlp_weights(inputs=inputs, hidden=hidden, layers=layers, outputs=outputs,
                          seed=seed)
    for i, (w, b) in _layer_order(len(weights), repeat, weights):
        h = h @ w + b
        if i < len(weights) - 1:
            h = np.maximum(h, 0)
    return h


def _layer_order(count: int, repeat: int, items: list) -> list:
    """(index, item) of each layer run, in order: the first, the hidden-to-hidden ones
    ``repeat`` times over, the output one."""
    if repeat < 1:
        raise ValueError("repeat must be >= 1")
    middle = list(range(1, count - 1))
    order = [0] * (count > 1) + middle * repeat + [count - 1]
    return [(i, items[i]) for i in order]


def mlp_param_bytes(*, inputs: int, hidden: int, layers: int, outputs: int) -> int:
    """Bytes of float32 parameters in such an MLP (≈ the model file's size)."""
    dims = [inputs] + [hidden] * layers + [outputs]
    return 4 * sum(a * b + b for a, b in zip(dims[:-1], dims[1:]))


def write_mlp(path: str | Path, *, inputs: int, hidden: int, layers: int, outputs: int,
              seed: int = 0, repeat: int = 1) -> Path:
    """Write an MLP ``X [N, inputs] float32 -> Y [N, outputs] float32`` to ``path``.

    ``layers`` hidden layers of width ``hidden`` with ReLU, then a linear output layer;
    ``repeat``: the hidden-to-hidden layers run that many times over with the same
    weights (a model as large, about that many times slower). Parents of ``path`` are
    created. Same arguments, same bytes.
    """
    weights = mlp_weights(inputs=inputs, hidden=hidden, layers=layers, outputs=outputs,
                          seed=seed)
    inits = [t for i, (w, b) in enumerate(weights)
             for t in (onnxfile.tensor(f"W{i}", w), onnxfile.tensor(f"B{i}", b))]
    nodes = []
    current = "X"
    order = _layer_order(len(weights), repeat, weights)
    for step, (i, _) in enumerate(order):
        last = step == len(order) - 1
        out = "Y" if last else f"G{step}"
        nodes.append(onnxfile.node("Gemm", [current, f"W{i}", f"B{i}"], [out],
                                   name=f"gemm{step}"))
        if not last:
            nodes.append(onnxfile.node("Relu", [out], [f"H{step}"], name=f"relu{step}"))
            current = f"H{step}"
    return _write(path, graph_name="mlp", nodes=nodes, initializers=inits,
                  inputs=[onnxfile.value_info("X", _FLOAT, ["N", inputs])],
                  outputs=[onnxfile.value_info("Y", _FLOAT, ["N", outputs])])


def classifier_weights(*, features: int, classes: int,
                       seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(W [features, classes], b [classes], x, y): a softmax regression fitted by
    gradient descent to ``classes`` generated clusters of points ``x`` labelled ``y``."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, features)) * 2
    y = rng.integers(0, classes, 300)
    x = (centres[y] + rng.standard_normal((len(y), features))).astype(np.float32)
    w, b = np.zeros((features, classes)), np.zeros(classes)
    onehot = np.eye(classes)[y]
    for _ in range(300):
        logits = x @ w + b
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        w -= 0.5 * x.T @ (p - onehot) / len(y)
        b -= 0.5 * (p - onehot).mean(axis=0)
    return w.astype(np.float32), b.astype(np.float32), x, y


def write_classifier(path: str | Path, *, features: int = 8, classes: int = 3,
                     seed: int = 0) -> Path:
    """The softmax regression of ``classifier_weights``.

    Input ``X [N, features]`` float32; outputs ``label`` int64 [N] and
    ``probabilities`` float32 [N, classes] (plain tensors).
    """
    w, b, _, _ = classifier_weights(features=features, classes=classes, seed=seed)
    axis = onnxfile.attribute("axis", 1)
    nodes = [onnxfile.node("Gemm", ["X", "W", "B"], ["logits"], name="linear"),
             onnxfile.node("Softmax", ["logits"], ["probabilities"], name="softmax",
                           attributes=[axis]),
             onnxfile.node("ArgMax", ["logits"], ["label"], name="argmax",
                           attributes=[axis, onnxfile.attribute("keepdims", 0)])]
    return _write(path, graph_name="classifier", nodes=nodes,
                  initializers=[onnxfile.tensor("W", w), onnxfile.tensor("B", b)],
                  inputs=[onnxfile.value_info("X", _FLOAT, ["N", features])],
                  outputs=[onnxfile.value_info("label", onnxfile.ELEM_TYPES["int64"], ["N"]),
                           onnxfile.value_info("probabilities", _FLOAT, ["N", classes])])


#: ``write_echo`` inputs: name -> (element type, ``onnxfile.ELEM_TYPES``' key; OIP datatype).
ECHO_TYPES = {"f32": ("float32", "FP32"), "f64": ("float64", "FP64"),
              "i32": ("int32", "INT32"), "i64": ("int64", "INT64"), "b": ("bool", "BOOL"),
              "s": ("string", "BYTES")}


def write_echo(path: str | Path) -> Path:
    """A model with one input per ``ECHO_TYPES`` entry (``in_<k>``, shape [N, -1]),
    each returned unchanged as ``out_<k>``: exercises every tensor datatype."""
    ins, outs, nodes = [], [], []
    for key, (elem_type, _) in ECHO_TYPES.items():
        elem = onnxfile.ELEM_TYPES[elem_type]
        ins.append(onnxfile.value_info(f"in_{key}", elem, ["N", "K"]))
        outs.append(onnxfile.value_info(f"out_{key}", elem, ["N", "K"]))
        nodes.append(onnxfile.node("Identity", [f"in_{key}"], [f"out_{key}"]))
    return _write(path, graph_name="echo", nodes=nodes, inputs=ins, outputs=outs)


#: The demo zoo: name -> MLP shape. Together larger than ``DEMO_BUDGET``: the demo evicts.
DEMO_MLPS: dict[str, dict[str, int]] = {
    "mlp-small": dict(inputs=64, hidden=256, layers=2, outputs=10, seed=1),
    "mlp-wide": dict(inputs=256, hidden=2048, layers=3, outputs=16, seed=2),
    "mlp-deep": dict(inputs=128, hidden=1536, layers=6, outputs=10, seed=3),
    "mlp-large": dict(inputs=512, hidden=2560, layers=3, outputs=32, seed=4),
    "mlp-medium": dict(inputs=128, hidden=1280, layers=4, outputs=8, seed=5),
}
DEMO_BUDGET = "128MB"
#: The demo's selection app (docs/selection.md): exp4 over the classifier and a second
#: one fitted to other data (``seed``), combining their class probabilities; feedback
#: with the classifier's own labels moves the weight to it.
DEMO_APP = "classifier-vote"
DEMO_APP_MEMBERS = {"classifier": 0, "classifier-b": 1}
DEMO_APP_CONFIG = ("backend: selection\n"
                   "selection:\n"
                   "  policy: exp4\n"
                   f"  candidates: [{', '.join(DEMO_APP_MEMBERS)}]\n"
                   "  output: {name: probabilities, kind: scores}\n"
                   "  default_output: [0.0]\n"
                   "slo: {latency_ms: 200}\n")


def demo_models() -> list[str]:
    """The names ``write_demo_repository`` writes (models and the app), sorted."""
    return sorted([*DEMO_MLPS, *DEMO_APP_MEMBERS, "synthetic-sleepy", DEMO_APP])


def write_demo_repository(root: str | Path) -> Path:
    """Create the demo model repository under ``root`` (idempotent: skips what exists)."""
    root = Path(root)
    for name, shape in DEMO_MLPS.items():
        target = root / name / "1" / "model.onnx"
        if not target.exists():
            write_mlp(target, **shape)
    for name, seed in DEMO_APP_MEMBERS.items():
        target = root / name / "1" / "model.onnx"
        if not target.exists():
            write_classifier(target, seed=seed)
    if not (root / "classifier" / "config.yaml").exists():
        (root / "classifier" / "config.yaml").write_text("pin: true\n")
    app = root / DEMO_APP / "config.yaml"
    if not app.exists():
        app.parent.mkdir(parents=True, exist_ok=True)
        app.write_text(DEMO_APP_CONFIG)
    synthetic = root / "synthetic-sleepy" / "config.yaml"
    if not synthetic.exists():
        synthetic.parent.mkdir(parents=True, exist_ok=True)
        synthetic.write_text(
            "backend: synthetic\n"
            "synthetic: {base_ms: 5, per_item_ms: 0.5, size_bytes: 1000000, load_ms: 200}\n"
        )
    return root


def _write(path: str | Path, **graph) -> Path:
    """The model of ``graph`` (``onnxfile.model``'s arguments) written to ``path``, its
    parents created."""
    data = onnxfile.model(**graph, ir_version=_IR_VERSION, opset=_OPSET,
                          producer="edgeagent.modelzoo")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, data)
    return path


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
