"""What compiled policy code is valid for: a hash of every Python source of the package.

numba's cache (``cachepolicies.kernels``) and the ahead-of-time replays
(``cachepolicies.native``) are both tied to it, so any edit of the package recompiles
them: a kernel has the code of the kernels it calls, in other modules, compiled in.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE = Path(__file__).parent


def package_stamp(root: Path = PACKAGE) -> str:
    """The SHA-256 (hex) of every ``*.py`` under ``root``, names and contents."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()
