"""The Azure Functions 2019 per-minute invocation-count CSV: read (validated) and write.

Format (one file per day in the public trace):
``HashOwner,HashApp,HashFunction,Trigger,1,2,...,1440``; column ``m`` holds the
function's invocations in minute ``m`` (1-based) of the file.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import TextIO

import numpy as np
import pandas as pd

from cachepolicies.workloads.errors import WorkloadError
from cachepolicies.workloads.invocations import InvocationCounts

ID_COLUMNS = ("HashOwner", "HashApp", "HashFunction", "Trigger")
HTTP_TRIGGER = "http"
_CHUNK_ROWS = 8192
_MAX_COUNT = np.iinfo(np.int32).max


def read_azure_invocations(path: str | Path, *, trigger: str | None = HTTP_TRIGGER,
                           start_minute: int = 0,
                           minutes: int | None = None) -> InvocationCounts:
    """The functions of ``path`` with ``Trigger == trigger`` (all if None), minutes
    ``[start_minute, start_minute + minutes)`` (0-based; all to the end if None).

    Only the minute columns in the window are read (and validated), which makes an
    hour of a day's file quick to load. Raises ``WorkloadError`` naming file, line and
    column on a bad header, an empty id cell or a count that is not a non-negative integer.
    """
    path = Path(path)
    header = _read_header(path)
    n_minutes = _check_header(path, header)
    if start_minute < 0 or start_minute >= n_minutes:
        raise WorkloadError(f"{path}: start minute {start_minute} is outside the file's "
                            f"minutes 0..{n_minutes - 1}")
    end = n_minutes if minutes is None else start_minute + minutes
    if minutes is not None and (minutes < 1 or end > n_minutes):
        raise WorkloadError(f"{path}: window of {minutes} minutes from minute {start_minute} "
                            f"does not fit the file's {n_minutes} minutes")
    wanted = [str(m + 1) for m in range(start_minute, end)]
    try:
        chunks = pd.read_csv(path, usecols=[*ID_COLUMNS, *wanted],
                             dtype={c: str for c in ID_COLUMNS}, na_filter=False,
                             chunksize=_CHUNK_ROWS, encoding="utf-8-sig")
        parts = [_parse_chunk(path, chunk, wanted, trigger) for chunk in chunks]
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: not a valid CSV: {exc}") from None
    if not parts:
        empty = np.empty(0, dtype=object)
        return InvocationCounts(empty, empty, empty, empty,
                                np.zeros((0, end - start_minute), dtype=np.int32), start_minute)
    return InvocationCounts(
        owners=np.concatenate([p[0] for p in parts]),
        apps=np.concatenate([p[1] for p in parts]),
        functions=np.concatenate([p[2] for p in parts]),
        triggers=np.concatenate([p[3] for p in parts]),
        counts=np.concatenate([p[4] for p in parts]),
        start_minute=start_minute,
    )


def write_azure_invocations(out: str | Path | TextIO, invocations: InvocationCounts) -> None:
    """Write ``invocations`` in the Azure CSV format to a path, or a text stream (``"-"``: stdout).

    Minute columns are labelled ``1..n_minutes`` (the file's own minutes).
    """
    if isinstance(out, (str, Path)) and str(out) != "-":
        with open(out, "w", encoding="utf-8", newline="") as stream:
            _write(stream, invocations)
    else:
        _write(sys.stdout if str(out) == "-" else out, invocations)


def _write(stream: TextIO, inv: InvocationCounts) -> None:
    labels = ",".join(str(m + 1) for m in range(inv.n_minutes))
    stream.write(",".join(ID_COLUMNS) + "," + labels + "\n")
    row_format = ",".join(["%d"] * inv.n_minutes) + "\n"
    for i in range(inv.n_functions):
        stream.write(f"{inv.owners[i]},{inv.apps[i]},{inv.functions[i]},{inv.triggers[i]},")
        stream.write(row_format % tuple(inv.counts[i].tolist()))


def _read_header(path: Path) -> list[str]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as stream:
            header = next(csv.reader(stream), None)
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: not a text CSV file") from None
    if not header:
        raise WorkloadError(f"{path}: empty file, expected a header row "
                            f"{','.join(ID_COLUMNS)},1,2,...")
    return [name.strip() for name in header]


def _check_header(path: Path, header: list[str]) -> int:
    """The number of minute columns; raises on a missing, duplicate or unexpected column."""
    for name in ID_COLUMNS:
        if name not in header:
            raise WorkloadError(f"{path}: missing column {name!r} (expected header "
                                f"{','.join(ID_COLUMNS)},1,2,...)")
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise WorkloadError(f"{path}: duplicate column {name!r}")
        seen.add(name)
    minute_labels = [name for name in header if name not in ID_COLUMNS]
    for position, name in enumerate(minute_labels, start=1):
        if name != str(position):
            raise WorkloadError(f"{path}: unexpected column {name!r}: minute columns must be "
                                f"1, 2, 3, ... in order (expected {str(position)!r})")
    if not minute_labels:
        raise WorkloadError(f"{path}: no minute columns (expected 1, 2, ... after "
                            f"{','.join(ID_COLUMNS)})")
    return len(minute_labels)


def _parse_chunk(path: Path, chunk: pd.DataFrame, wanted: list[str],
                 trigger: str | None) -> tuple[np.ndarray, ...]:
    ids = []
    for name in ID_COLUMNS:
        values = chunk[name].to_numpy(dtype=object)
        blank = np.flatnonzero(chunk[name].str.strip().to_numpy() == "")
        if len(blank):
            raise WorkloadError(f"{path}: line {_line(chunk, blank[0])}, column {name!r}: "
                                f"empty value")
        ids.append(values)
    counts = _counts(path, chunk, wanted)
    keep = slice(None) if trigger is None else ids[3] == trigger
    return (*(values[keep] for values in ids), counts[keep])


def _counts(path: Path, chunk: pd.DataFrame, wanted: list[str]) -> np.ndarray:
    """The chunk's counts as int32; raises naming the first bad cell."""
    block = chunk[wanted]
    if all(dtype.kind in "iu" for dtype in block.dtypes):
        values = block.to_numpy()
        if not len(values) or (values.min() >= 0 and values.max() <= _MAX_COUNT):
            return values.astype(np.int32)
    columns = []
    first_bad: tuple[int, str, object] | None = None
    for name in wanted:
        series = chunk[name]
        if series.dtype.kind in "iu":
            values = series.to_numpy()
            bad = (values < 0) | (values > _MAX_COUNT)
        else:
            numbers = pd.to_numeric(series, errors="coerce").to_numpy(dtype=float)
            with np.errstate(invalid="ignore"):
                bad = ~np.isfinite(numbers) | (numbers < 0) | (numbers % 1 != 0) \
                    | (numbers > _MAX_COUNT)
            values = np.where(bad, 0, numbers)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            if first_bad is None or row < first_bad[0]:
                first_bad = (row, name, series.iloc[row])
        columns.append(values.astype(np.int32))
    if first_bad is not None:
        row, name, value = first_bad
        shown = "empty" if str(value).strip() == "" else repr(str(value))
        raise WorkloadError(f"{path}: line {_line(chunk, row)}, column {name!r}: count {shown} "
                            f"is not a non-negative integer")
    return np.stack(columns, axis=1) if columns else np.zeros((len(chunk), 0), np.int32)


def _line(chunk: pd.DataFrame, position: int) -> int:
    """The 1-based file line of the chunk's row ``position`` (line 1 is the header)."""
    return int(chunk.index[position]) + 2
