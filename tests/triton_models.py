"""ONNX equivalents of the models Triton's example clients expect (``simple``,
``simple_string``, ``simple_identity``), built with ``onnx.helper``, and a repository
holding them. Shared by the HTTP and gRPC tests.

- ``simple``: INT32 INPUT0, INPUT1 [-1, 16] -> OUTPUT0 = sum, OUTPUT1 = difference; its
  ``config.pbtxt`` says ``max_batch_size: 8`` as Triton's example repository does.
- ``simple_string``: the same on BYTES (ONNX strings) through ``Cast`` string -> int32
  and back, so it rejects inputs that are not decimal numbers (the empty strings of a
  default warm-up included).
- ``simple_identity``: BYTES INPUT0 [-1, -1] -> OUTPUT0, unchanged.
"""

from __future__ import annotations

from pathlib import Path

SIMPLE_PBTXT = """\
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
"""


def _save(graph, path: Path) -> Path:
    from onnx import checker, helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def write_simple(path: str | Path, *, strings: bool = False) -> Path:
    """``simple`` (INT32) or, with ``strings``, ``simple_string`` (BYTES) at ``path``."""
    from onnx import TensorProto, helper

    io = TensorProto.STRING if strings else TensorProto.INT32
    nodes, a, b = [], "INPUT0", "INPUT1"
    if strings:
        nodes += [helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
                  helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32)]
        a, b = "a", "b"
    sum_, diff = ("s", "d") if strings else ("OUTPUT0", "OUTPUT1")
    nodes += [helper.make_node("Add", [a, b], [sum_]), helper.make_node("Sub", [a, b], [diff])]
    if strings:
        nodes += [helper.make_node("Cast", ["s"], ["OUTPUT0"], to=TensorProto.STRING),
                  helper.make_node("Cast", ["d"], ["OUTPUT1"], to=TensorProto.STRING)]
    shape = ["batch", 16]
    graph = helper.make_graph(
        nodes, "simple_string" if strings else "simple",
        [helper.make_tensor_value_info(n, io, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, io, shape) for n in ("OUTPUT0", "OUTPUT1")])
    return _save(graph, Path(path))


def write_identity(path: str | Path) -> Path:
    """``simple_identity``: BYTES INPUT0 [-1, -1] -> OUTPUT0."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "simple_identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.STRING, ["batch", "n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, ["batch", "n"])])
    return _save(graph, Path(path))


def write_triton_examples(repo: str | Path, *, extra: int = 4) -> Path:
    """``simple`` (with its config.pbtxt), ``simple_string``, ``simple_identity`` and
    ``extra`` small MLPs (``mlp0``...) under ``repo``: seven models by default, as
    Triton's ``simple_http_model_control`` expects in the index."""
    from agent.modelzoo import write_mlp

    repo = Path(repo)
    write_simple(repo / "simple" / "1" / "model.onnx")
    (repo / "simple" / "config.pbtxt").write_text(SIMPLE_PBTXT)
    write_simple(repo / "simple_string" / "1" / "model.onnx", strings=True)
    write_identity(repo / "simple_identity" / "1" / "model.onnx")
    for i in range(extra):
        write_mlp(repo / f"mlp{i}" / "1" / "model.onnx", inputs=4, hidden=8, layers=1,
                  outputs=2, seed=i)
    return repo
