"""The Azure Functions 2019 per-minute invocation-count CSV: read (validated) and write.

Format (one file per day in the public trace):
``HashOwner,HashApp,HashFunction,Trigger,1,2,...,1440``; column ``m`` holds the
function's invocations in minute ``m`` (1-based) of the file.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Iterator, TextIO

import numpy as np

from cachepolicies.traces import csv_rows
from cachepolicies.workloads.errors import WorkloadError
from cachepolicies.workloads.invocations import InvocationCounts

ID_COLUMNS = ("HashOwner", "HashApp", "HashFunction", "Trigger")
HTTP_TRIGGER = "http"
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
        parts = list(_read_batches(path, wanted, trigger))
    except _BadCell:
        _diagnose(path, header, wanted)
        raise WorkloadError(f"{path}: not a valid CSV") from None
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


class _BadCell(Exception):
    """A batch holds a value the fast path does not take: ``_diagnose`` names it."""


def _read_batches(path: Path, wanted: list[str],
                  trigger: str | None) -> Iterator[tuple[np.ndarray, ...]]:
    """(owners, apps, functions, triggers, int32 counts) per batch of rows of the trigger,
    parsed by pyarrow's streaming CSV reader (only the window's columns); raises
    ``_BadCell`` on anything but non-blank ids and counts in 0..2**31-1."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    types = {**{c: pa.string() for c in ID_COLUMNS}, **{c: pa.int64() for c in wanted}}
    try:
        reader = pacsv.open_csv(path, convert_options=pacsv.ConvertOptions(
            column_types=types, include_columns=list(types), null_values=[""],
            strings_can_be_null=False))
        for batch in reader:
            ids = [batch.column(name).to_numpy(zero_copy_only=False) for name in ID_COLUMNS]
            if any(not value.strip() for values in ids for value in values):
                raise _BadCell
            columns = [batch.column(name) for name in wanted]
            if any(column.null_count for column in columns):
                raise _BadCell
            counts = (np.stack([column.to_numpy() for column in columns], axis=1) if columns
                      else np.zeros((batch.num_rows, 0), np.int64))
            if counts.size and (counts.min() < 0 or counts.max() > _MAX_COUNT):
                raise _BadCell
            keep = slice(None) if trigger is None else ids[3] == trigger
            yield (*(values[keep] for values in ids), counts[keep].astype(np.int32))
    except (pa.ArrowInvalid, UnicodeDecodeError):
        raise _BadCell from None


def _diagnose(path: Path, header: list[str], wanted: list[str]) -> None:
    """Find the first bad cell with Python's csv module and raise naming its line and
    column (the slow path: only for a file the fast one refused)."""
    positions = {name: header.index(name) for name in (*ID_COLUMNS, *wanted)}
    for line, row in csv_rows(path, len(header)):
        if isinstance(row, str):
            raise WorkloadError(f"{path}: line {line}: {row}")
        for name in ID_COLUMNS:
            if row[positions[name]].strip() == "":
                raise WorkloadError(f"{path}: line {line}, column {name!r}: empty value")
        for name in wanted:
            text = row[positions[name]]
            if not (text.isascii() and text.isdigit() and int(text) <= _MAX_COUNT):
                shown = "empty" if text.strip() == "" else repr(text)
                raise WorkloadError(f"{path}: line {line}, column {name!r}: count {shown} "
                                    f"is not a non-negative integer")
