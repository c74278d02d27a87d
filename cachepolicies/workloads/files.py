"""Writing the simulator's two CSV files (DESIGN.md): a trace and model profiles.

The readers, with validation, are ``cachepolicies.traces.read_trace`` / ``read_profiles``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, TextIO

import numpy as np

from cachepolicies.traces import Profiles


def write_trace(out: str | Path | TextIO, timestamps: np.ndarray,
                models: Sequence[str]) -> None:
    """Write ``timestamp,model`` rows; timestamps in seconds with 6 decimals (microseconds).

    Rounding is monotone, so non-decreasing timestamps stay non-decreasing.
    """
    quoted = {name: _field(name) for name in set(models) if _field(name) != name}
    if quoted:
        models = [quoted.get(name, name) for name in models]
    with _open(out) as stream:
        stream.write("timestamp,model\n")
        rows = map("{:.6f},{}\n".format, np.asarray(timestamps, dtype=float).tolist(), models)
        stream.writelines(rows)


def write_profiles(out: str | Path | TextIO, profiles: Profiles) -> None:
    """Write ``model,size_bytes,load_seconds,exec_seconds`` (+ ``first_exec_seconds`` when
    the profiles have it; an unmeasured value is an empty cell)."""
    first_exec = profiles.first_exec_seconds
    with _open(out) as stream:
        stream.write("model,size_bytes,load_seconds,exec_seconds")
        stream.write(",first_exec_seconds\n" if first_exec is not None else "\n")
        for i, name in enumerate(profiles.names):
            stream.write(f"{_field(name)},{int(profiles.size_bytes[i])},"
                         f"{_seconds(profiles.load_seconds[i])},"
                         f"{_seconds(profiles.exec_seconds[i])}")
            if first_exec is not None:
                stream.write("," + _seconds(first_exec[i]))
            stream.write("\n")


def _field(text: str) -> str:
    """``text`` as a CSV field: quoted (quotes doubled) only where it has to be."""
    if any(c in text for c in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _seconds(value: float) -> str:
    return "" if math.isnan(value) else f"{float(value):.9g}"


@contextmanager
def _open(out: str | Path | TextIO) -> Iterator[TextIO]:
    """A text stream for a path (``"-"``: stdout) or the stream itself; paths are closed."""
    if isinstance(out, (str, Path)):
        if str(out) == "-":
            yield sys.stdout
            return
        with open(out, "w", encoding="utf-8", newline="") as stream:
            yield stream
    else:
        yield out
