"""Regenerate the ``*_pb2.py`` and ``*_pb2_grpc.py`` modules here from the ``.proto``
files (``make protos`` runs it in a throwaway venv with the pinned
grpcio-tools; ``python agent/backends/tfserving_pb/regenerate.py`` with any Python that
has it: it imports nothing of the agent).

grpcio-tools 1.75.1 bundles protoc 31.1: its code needs protobuf >= 6.31.1 at run time,
as agent/node/protos does. Each module registers its file in this package's ``POOL``
instead of protobuf's default pool (see ``__init__``).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PROTOS = ("tensorflow_error.proto", "tensorflow.proto", "tensorflow_serving.proto")

_DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
_OWN_POOL = ("from agent.backends.tfserving_pb import POOL  # a pool of its own (see __init__)\n"
             "DESCRIPTOR = POOL.AddSerializedFile(")


def main() -> int:
    from grpc_tools import protoc

    for name in PROTOS:
        rel = (HERE / name).relative_to(ROOT)
        outputs = [f"--python_out={ROOT}"]
        if name == "tensorflow_serving.proto":
            outputs.append(f"--grpc_python_out={ROOT}")
        code = protoc.main(["protoc", f"-I{ROOT}", f"-I{protoc_include()}", *outputs, str(rel)])
        if code != 0:
            return code
        pb2 = HERE / name.replace(".proto", "_pb2.py")
        text = pb2.read_text()
        if text.count(_DEFAULT_POOL) != 1:
            print(f"{pb2}: expected one {_DEFAULT_POOL!r}; protoc's output changed",
                  file=sys.stderr)
            return 1
        pb2.write_text(text.replace(_DEFAULT_POOL, _OWN_POOL))
        print(f"wrote {pb2.name}")
    return 0


def protoc_include() -> str:
    """grpcio-tools' copy of the well-known types (google/protobuf/any.proto, ...)."""
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


if __name__ == "__main__":
    sys.exit(main())
