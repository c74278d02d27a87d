"""Small SavedModels for the TF Serving tests, written locally with TensorFlow (never
downloaded). Run in a subprocess so the test process itself never imports TensorFlow:

    python tests/tfserving_standin/savedmodels.py OUT_DIR

writes ``OUT_DIR/repo/<model>/<version>/saved_model.pb`` (+ variables) and, for checking
outputs with numpy, ``OUT_DIR/weights/<model>_v<version>.npz``:

- ``mlp`` v1, v2 (Keras): ``x`` FP32 [-1, 4] → ``y`` FP32 [-1, 3] = relu(x W1 + b1) W2 + b2,
  different weights per version;
- ``typed`` v1 (tf.Module): ``text`` BYTES [-1], ``count`` INT64 [-1, 2] → ``upper`` BYTES
  (upper-cased text), ``doubled`` INT64 (2 × count), ``positive`` BOOL (count > 0),
  ``half`` FP16 (count / 2).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def mlp_weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w1": rng.normal(size=(4, 8)).astype(np.float32),
            "b1": rng.normal(size=8).astype(np.float32),
            "w2": rng.normal(size=(8, 3)).astype(np.float32),
            "b2": rng.normal(size=3).astype(np.float32)}


def mlp_forward(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    """What the ``mlp`` SavedModel computes, in numpy."""
    return np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"] + w["b2"]


def write_mlp(path: Path, weights: dict[str, np.ndarray]) -> None:
    import keras
    import tensorflow as tf

    inputs = keras.Input(shape=(4,), name="x")
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    outputs = keras.layers.Dense(3, name="y")(hidden)
    model = keras.Model(inputs, {"y": outputs})
    model.layers[1].set_weights([weights["w1"], weights["b1"]])
    model.layers[2].set_weights([weights["w2"], weights["b2"]])

    # A plain tf.function signature gives stable tensor names ("x" → "y").
    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def serve(x):
        return {"y": model(x)["y"]}

    module = tf.Module()
    module.model = model
    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})


def write_typed(path: Path) -> None:
    import tensorflow as tf

    class Typed(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text"),
                                      tf.TensorSpec([None, 2], tf.int64, name="count")])
        def serve(self, text, count):
            return {"upper": tf.strings.upper(text), "doubled": count * 2,
                    "positive": count > 0, "half": tf.cast(count, tf.float16) / 2}

    module = Typed()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


def main(out: Path) -> None:
    repo, weights_dir = out / "repo", out / "weights"
    weights_dir.mkdir(parents=True, exist_ok=True)
    for version, seed in ((1, 1), (2, 2)):
        weights = mlp_weights(seed)
        np.savez(weights_dir / f"mlp_v{version}.npz", **weights)
        write_mlp(repo / "mlp" / str(version), weights)
    write_typed(repo / "typed" / "1")
    print(json.dumps({"repo": str(repo), "weights": str(weights_dir)}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
