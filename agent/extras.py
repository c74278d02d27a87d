"""How to add an extra of the edgeagent distribution (``sim``, ``coordinator``, ``s3``,
...) to the interpreter that runs this process: the hint a command or a model source
gives when a package of its extra is missing. It names that interpreter
(``sys.executable -m pip``: not whatever ``pip`` is on PATH) and the extra's own
requirements (not ``edgeagent[extra]``, which pip would fetch from an index in place of
the installed checkout). A shared leaf: the standard library only.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from importlib import metadata

DISTRIBUTION = "edgeagent"
_EXTRA_MARKER = re.compile(r"""^\s*extra\s*==\s*["']([\w.-]+)["']\s*$""")
_SELF = re.compile(rf"^{DISTRIBUTION}\[([\w.,\s-]+)\]$")


def requirements(extra: str) -> list[str]:
    """The requirements ``extra`` adds (``numba<0.69,>=0.68``, ...), an extra that names
    others (``all``) expanded; empty when the distribution's metadata is not there (a
    checkout run without an install)."""
    try:
        declared = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []
    found: list[str] = []
    for line in declared:
        requirement, _, marker = line.partition(";")
        match = _EXTRA_MARKER.match(marker)
        if match is None or match.group(1) != extra:
            continue
        requirement = requirement.strip()
        nested = _SELF.match(requirement.replace(" ", ""))
        for item in ([r for e in nested.group(1).split(",") for r in requirements(e)]
                     if nested else [requirement]):
            if item not in found:
                found.append(item)
    return found


def interpreter() -> str:
    """The running interpreter as a shell would be told it: relative to the current
    directory where it is below it (``.venv/bin/python`` in a checkout)."""
    python = sys.executable or "python3"
    try:
        relative = os.path.relpath(python)
    except ValueError:  # another drive
        return python
    return relative if not relative.startswith("..") else python


def install_hint(extra: str, packages: tuple[str, ...] = ()) -> str:
    """The command that adds ``extra`` to this interpreter: ``.venv/bin/python -m pip
    install 'numba<0.69,>=0.68' pyarrow ...`` (``packages``, pip names, where the
    metadata cannot say)."""
    wanted = requirements(extra) or list(packages) or [f"{DISTRIBUTION}[{extra}]"]
    return f"{shlex.quote(interpreter())} -m pip install " + " ".join(
        shlex.quote(r) for r in wanted)
