"""Regenerate ``grpc_predict_v2_pb2.py`` and ``grpc_predict_v2_pb2_grpc.py`` from
``grpc_predict_v2.proto`` (``make protos`` runs it in a throwaway venv with the pinned
grpcio-tools; ``python -m agent.node.protos.regenerate`` with any Python that has it).

Two choices, both checked by ``tests/test_grpc_v2.py``:

- grpcio-tools 1.75.1 bundles protoc 31.1: its code needs protobuf >= 6.31.1 at run
  time (the floor the project's other dependencies set) and runs on 7.x too; a newer
  protoc's code would refuse protobuf 6.x, which tritonclient[grpc] pins (< 7).
- The messages are registered in a pool of their own, not protobuf's default pool: the
  names are upstream's (``inference.ModelInferRequest``, ...), so tritonclient's own
  copy of them can be imported in the same process (as the tests do) without a
  "duplicate symbol" clash.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PROTO = HERE / "grpc_predict_v2.proto"
PB2 = HERE / "grpc_predict_v2_pb2.py"

_DEFAULT_POOL = "_descriptor_pool.Default().AddSerializedFile("
_OWN_POOL = ("#: A pool of its own: tritonclient registers the same upstream names in the\n"
             "#: default pool (see agent/node/protos/regenerate.py).\n"
             "POOL = _descriptor_pool.DescriptorPool()\n"
             "DESCRIPTOR = POOL.AddSerializedFile(")


def main() -> int:
    from grpc_tools import protoc

    rel = PROTO.relative_to(ROOT)
    code = protoc.main(["protoc", f"-I{ROOT}", f"--python_out={ROOT}",
                        f"--grpc_python_out={ROOT}", str(rel)])
    if code != 0:
        return code
    text = PB2.read_text()
    old = "DESCRIPTOR = " + _DEFAULT_POOL
    if text.count(old) != 1:
        print(f"{PB2}: expected one {old!r}; protoc's output changed", file=sys.stderr)
        return 1
    PB2.write_text(text.replace(old, _OWN_POOL))
    print(f"wrote {PB2.name} and {PB2.stem}_grpc.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
