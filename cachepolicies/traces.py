"""Read and validate the simulator's two CSV files: a request trace and model profiles.

- trace: ``timestamp,model`` — seconds (float, non-decreasing, >= 0) and a model name;
  extra columns are ignored.
- profiles: ``model,size_bytes,load_seconds,exec_seconds`` plus the optional
  ``first_exec_seconds``, ``download_seconds`` (pulling the model's files from its source
  into the disk tier; absent: 0) and ``disk_bytes`` (the files' bytes on disk; absent:
  ``size_bytes``), and for the twin ``exec_seconds_per_row`` (what each row beyond the
  first adds to a batch) and ``load_slot_seconds`` (how long a load held its load slot
  once it had room, as a node measured it: the load and the runtime's hand-offs); extra
  columns (e.g. ``disk_mb``) are ignored.

Model names are interned: a trace holds, per request, the integer id of its model (the
row of that model in the profiles), so the simulator works on ints only.

Load penalty (the seconds a miss adds to a request, and the ``penalty`` policies get):
``penalty = load_seconds + max(first_exec_seconds - exec_seconds, 0)``, the second term
only where ``first_exec_seconds`` is given (an empty cell means "not measured"). The
cold first execution of a freshly loaded model is slower than a warm one (graph
optimisation, allocation); that surplus is paid on the miss's critical path, like the
load. The CremeBrulee profiles already fold it into ``load_seconds`` (load = cold first
execution − warm execution), so they carry no ``first_exec_seconds``.

Errors are ``SimulationInputError`` (a ``ValueError``) naming the file, the line (the
header is line 1), the column and the problem. Blank lines are errors ("empty row"),
not skipped, so line numbers stay exact.
"""

from __future__ import annotations

import csv
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np

from cachepolicies.pool import miss_penalty

if TYPE_CHECKING:
    import pyarrow as pa

# pyarrow (the sim extra) is imported by the readers: the profiles and traces written by
# the agent's own commands (edgeagent profile) need none of it.

TRACE_COLUMNS = ("timestamp", "model")
PROFILE_COLUMNS = ("model", "size_bytes", "load_seconds", "exec_seconds")
OPTIONAL_PROFILE_COLUMNS = ("first_exec_seconds", "exec_seconds_per_row",
                            "load_slot_seconds", "download_seconds", "disk_bytes")
#: Optional columns whose cells may be empty (not measured).
_NULLABLE = ("first_exec_seconds", "exec_seconds_per_row", "load_slot_seconds")


class SimulationInputError(ValueError):
    """A simulation input file (or capacity) is unusable; the message says where and why."""

    def __init__(
        self, source: str, problem: str, *, line: int | None = None, column: str | None = None
    ) -> None:
        where = source
        if line is not None:
            where += f": line {line}"
        if column is not None:
            where += f", column {column!r}" if line is not None else f": column {column!r}"
        super().__init__(f"{where}: {problem}")
        self.source = source
        self.line = line
        self.column = column
        self.problem = problem


@dataclass(frozen=True)
class Profiles:
    """Per-model size and timings; model ``i`` is ``names[i]``."""

    names: list[str]
    size_bytes: np.ndarray  # int64
    load_seconds: np.ndarray  # float64
    exec_seconds: np.ndarray  # float64
    first_exec_seconds: np.ndarray | None  # float64, NaN where not measured
    penalty_seconds: np.ndarray  # float64: what a miss costs, see the module docstring
    index: dict[str, int]
    source: str
    exec_seconds_per_row: np.ndarray | None = None  # float64, NaN where not measured
    load_slot_seconds: np.ndarray | None = None  # float64, NaN where not measured
    # The disk tier's columns (``cachepolicies.tiers``); None where the file has none.
    download_seconds: np.ndarray | None = None  # float64
    disk_bytes: np.ndarray | None = None  # int64

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class Trace:
    """Requests in time order: ``model_ids[i]`` (a profile row) at ``timestamps[i]``."""

    timestamps: np.ndarray  # float64, non-decreasing
    model_ids: np.ndarray  # int64, indexes into the profiles
    source: str
    #: Requests left out for naming a model without a profile (``skip_unknown``), and
    #: those models.
    skipped: int = 0
    skipped_models: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.model_ids)


def cremebrulee_profiles_path() -> Path:
    """The shipped CremeBrulee model profiles (26 Keras models; see data/README.md)."""
    # Source: the CremeBrulee artifact, https://github.com/cake-lab/CremeBrulee (load and
    # exec times, AWS m5.large); sizes estimated from Keras weight sizes (data/README.md).
    return Path(str(resources.files("cachepolicies") / "data" / "cremebrulee-profiles.csv"))


def load_penalty(
    load_seconds: np.ndarray, exec_seconds: np.ndarray, first_exec_seconds: np.ndarray | None
) -> np.ndarray:
    """``cachepolicies.pool.miss_penalty`` per model, the surplus only where first_exec
    is known."""
    return miss_penalty(load_seconds, first_exec_seconds, exec_seconds)


# -- profiles -----------------------------------------------------------------------------
def read_profiles(path: str | Path, *, name: str | None = None) -> Profiles:
    """Parse and validate a profiles CSV file (``name``: what messages call it, default
    its path)."""
    with _named(name):
        return _read_profiles(str(path), name)


@contextmanager
def _named(name: str | None) -> Iterator[None]:
    """An input error of the block said of ``name`` (a file's display name) instead of
    the file read (a temporary copy)."""
    try:
        yield
    except SimulationInputError as exc:
        if name is None:
            raise
        raise SimulationInputError(name, exc.problem, line=exc.line,
                                   column=exc.column) from None


def _read_profiles(source: str, name: str | None) -> Profiles:
    import pyarrow as pa

    header = _read_header(source, PROFILE_COLUMNS)
    optional = [c for c in OPTIONAL_PROFILE_COLUMNS if c in header]
    types = {"model": pa.string(), "size_bytes": pa.float64(), "load_seconds": pa.float64(),
             "exec_seconds": pa.float64(), **{c: pa.float64() for c in optional}}
    table = _read_table(source, header, types, nullable=set(optional) & set(_NULLABLE))

    def column(name: str) -> np.ndarray | None:
        return _floats(table[name]) if name in optional else None

    return _build_profiles(
        names=table["model"].to_pylist(),
        size_bytes=_floats(table["size_bytes"]),
        load_seconds=_floats(table["load_seconds"]),
        exec_seconds=_floats(table["exec_seconds"]),
        first_exec_seconds=column("first_exec_seconds"),
        exec_seconds_per_row=column("exec_seconds_per_row"),
        load_slot_seconds=column("load_slot_seconds"),
        download_seconds=column("download_seconds"),
        disk_bytes=column("disk_bytes"),
        source=name or source,
        line_offset=2,
    )


def make_profiles(
    names: list[str],
    size_bytes: list[int] | np.ndarray,
    load_seconds: list[float] | np.ndarray,
    exec_seconds: list[float] | np.ndarray,
    first_exec_seconds: list[float] | np.ndarray | None = None,
    *,
    exec_seconds_per_row: list[float] | np.ndarray | None = None,
    load_slot_seconds: list[float] | np.ndarray | None = None,
    download_seconds: list[float] | np.ndarray | None = None,
    disk_bytes: list[int] | np.ndarray | None = None,
    source: str = "<profiles>",
) -> Profiles:
    """Profiles from in-memory columns, validated like a file (rows count from 1)."""

    def floats(values) -> np.ndarray | None:
        return None if values is None else np.asarray(values, dtype=np.float64)

    return _build_profiles(
        names=list(names),
        size_bytes=np.asarray(size_bytes, dtype=np.float64),
        load_seconds=np.asarray(load_seconds, dtype=np.float64),
        exec_seconds=np.asarray(exec_seconds, dtype=np.float64),
        first_exec_seconds=floats(first_exec_seconds),
        exec_seconds_per_row=floats(exec_seconds_per_row),
        load_slot_seconds=floats(load_slot_seconds),
        download_seconds=floats(download_seconds),
        disk_bytes=floats(disk_bytes),
        source=source,
        line_offset=1,
    )


def _build_profiles(
    *,
    names: list[str],
    size_bytes: np.ndarray,
    load_seconds: np.ndarray,
    exec_seconds: np.ndarray,
    first_exec_seconds: np.ndarray | None,
    source: str,
    line_offset: int,
    exec_seconds_per_row: np.ndarray | None = None,
    load_slot_seconds: np.ndarray | None = None,
    download_seconds: np.ndarray | None = None,
    disk_bytes: np.ndarray | None = None,
) -> Profiles:
    if not names:
        raise SimulationInputError(source, "no models after the header")
    columns = (size_bytes, load_seconds, exec_seconds, first_exec_seconds,
               exec_seconds_per_row, load_slot_seconds, download_seconds, disk_bytes)
    if any(c is not None and len(c) != len(names) for c in columns):
        raise SimulationInputError(source, "columns of different lengths")
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        if not name:
            raise SimulationInputError(
                source, "empty model name", line=i + line_offset, column="model"
            )
        first = index.setdefault(name, i)
        if first != i:
            raise SimulationInputError(
                source,
                f"model {name!r} is listed twice (first on line {first + line_offset})",
                line=i + line_offset,
                column="model",
            )
    for column, values in (
        ("size_bytes", size_bytes),
        ("load_seconds", load_seconds),
        ("exec_seconds", exec_seconds),
        ("first_exec_seconds", first_exec_seconds),
        ("exec_seconds_per_row", exec_seconds_per_row),
        ("load_slot_seconds", load_slot_seconds),
        ("download_seconds", download_seconds),
        ("disk_bytes", disk_bytes),
    ):
        if values is None:
            continue
        _check_non_negative(source, column, values, line_offset,
                            allow_nan=column in _NULLABLE)
    for column, values in (("size_bytes", size_bytes), ("disk_bytes", disk_bytes)):
        whole = np.flatnonzero(values != np.floor(values)) if values is not None else ()
        if len(whole):
            i = int(whole[0])
            raise SimulationInputError(
                source,
                f"{float(values[i])!r} is not a whole number of bytes",
                line=i + line_offset,
                column=column,
            )
    return Profiles(
        names=names,
        size_bytes=size_bytes.astype(np.int64),
        load_seconds=load_seconds,
        exec_seconds=exec_seconds,
        first_exec_seconds=first_exec_seconds,
        penalty_seconds=load_penalty(load_seconds, exec_seconds, first_exec_seconds),
        index=index,
        source=source,
        exec_seconds_per_row=exec_seconds_per_row,
        load_slot_seconds=load_slot_seconds,
        download_seconds=download_seconds,
        disk_bytes=None if disk_bytes is None else disk_bytes.astype(np.int64),
    )


def _check_non_negative(
    source: str, column: str, values: np.ndarray, line_offset: int, *, allow_nan: bool
) -> None:
    bad_nan = np.isnan(values) if not allow_nan else np.zeros(len(values), dtype=bool)
    bad = bad_nan | np.isinf(values) | (values < 0)
    rows = np.flatnonzero(bad)
    if rows.size:
        i = int(rows[0])
        value = float(values[i])
        problem = f"{value!r} is negative" if value < 0 else f"{value!r} is not a finite number"
        raise SimulationInputError(source, problem, line=i + line_offset, column=column)


# -- trace ----------------------------------------------------------------------------------
def read_trace(path: str | Path, profiles: Profiles, *, name: str | None = None,
               skip_unknown: bool = False) -> Trace:
    """Parse and validate a trace CSV file; every model must be in ``profiles``, or with
    ``skip_unknown`` the requests of the others are left out (counted in the trace's
    ``skipped``). ``name``: what messages call the file (default its path)."""
    with _named(name):
        return _read_trace(str(path), profiles, skip_unknown, name)


def _read_trace(source: str, profiles: Profiles, skip_unknown: bool,
                name: str | None) -> Trace:
    import pyarrow as pa

    header = _read_header(source, TRACE_COLUMNS)
    # The reader dictionary-encodes the names as it parses (no string column, and no
    # pyarrow.compute import in every simulate process); one dictionary for all.
    table = _read_table(source, header, {"timestamp": pa.float64(),
                                         "model": pa.dictionary(pa.int32(), pa.string())})
    if table.num_rows == 0:
        raise SimulationInputError(source, "no requests after the header")
    models = table.unify_dictionaries()["model"]
    codes = np.concatenate([_to_numpy(chunk.indices) for chunk in models.chunks]
                           ).astype(np.int64)
    dictionary = models.chunks[0].dictionary.to_pylist()
    timestamps = _floats(table["timestamp"])
    return _build_trace(timestamps, codes, dictionary, profiles, name or source,
                        line_offset=2, skip_unknown=skip_unknown)


def make_trace(
    timestamps: list[float] | np.ndarray,
    models: list[str],
    profiles: Profiles,
    *,
    source: str = "<trace>",
) -> Trace:
    """A trace from in-memory columns, validated like a file (rows count from 1)."""
    codes_by_name: dict[str, int] = {}
    codes = np.fromiter(
        (codes_by_name.setdefault(m, len(codes_by_name)) for m in models),
        dtype=np.int64,
        count=len(models),
    )
    if len(timestamps) != len(models):
        raise SimulationInputError(
            source, f"{len(timestamps)} timestamps for {len(models)} models"
        )
    if not len(models):
        raise SimulationInputError(source, "no requests")
    return _build_trace(
        np.asarray(timestamps, dtype=np.float64), codes, list(codes_by_name), profiles,
        source, line_offset=1,
    )


def _build_trace(
    timestamps: np.ndarray,
    codes: np.ndarray,
    dictionary: list[str],
    profiles: Profiles,
    source: str,
    *,
    line_offset: int,
    skip_unknown: bool = False,
) -> Trace:
    lookup = np.array([profiles.index.get(name, -1) for name in dictionary], dtype=np.int64)
    unknown = np.flatnonzero(lookup < 0)
    skipped, skipped_models = 0, ()
    if unknown.size and skip_unknown:
        keep = lookup[codes] >= 0
        skipped = int(len(codes) - keep.sum())
        skipped_models = tuple(sorted(dictionary[i] for i in unknown
                                      if np.any(codes == i)))
        timestamps, codes = timestamps[keep], codes[keep]
        if not len(codes):
            raise SimulationInputError(source, f"no request names a model in the profiles "
                                       f"({profiles.source}): all {skipped} are of "
                                       f"{', '.join(skipped_models)}")
        unknown = unknown[:0]
    if unknown.size:
        first_row = int(np.flatnonzero(np.isin(codes, unknown))[0])
        name = dictionary[codes[first_row]]
        problem = (
            "empty model name"
            if name == ""
            else f"model {name!r} is not in the profiles ({profiles.source})"
        )
        if unknown.size > 1:
            problem += f"; {unknown.size - 1} other unknown model name(s) too"
        raise SimulationInputError(source, problem, line=first_row + line_offset, column="model")
    bad = np.flatnonzero(~np.isfinite(timestamps) | (timestamps < 0))
    if bad.size:
        i = int(bad[0])
        value = float(timestamps[i])
        problem = f"{value!r} is negative" if value < 0 else f"{value!r} is not a finite number"
        raise SimulationInputError(source, problem, line=i + line_offset, column="timestamp")
    back = np.flatnonzero(timestamps[1:] < timestamps[:-1])
    if back.size:
        i = int(back[0]) + 1
        raise SimulationInputError(
            source,
            f"{float(timestamps[i])!r} is earlier than {float(timestamps[i - 1])!r} on line "
            f"{i - 1 + line_offset} (timestamps must be non-decreasing)",
            line=i + line_offset,
            column="timestamp",
        )
    return Trace(timestamps=timestamps, model_ids=lookup[codes], source=source,
                 skipped=skipped, skipped_models=skipped_models)


def check_capacity(trace: Trace, profiles: Profiles, capacity_bytes: int) -> None:
    """Raise when a model the trace requests cannot fit in ``capacity_bytes`` at all."""
    if capacity_bytes < 0:
        raise SimulationInputError("capacity", f"{capacity_bytes} bytes is negative")
    present = np.zeros(len(profiles), dtype=bool)
    present[trace.model_ids] = True
    requested = np.flatnonzero(present)
    if not requested.size:
        return
    sizes = profiles.size_bytes[requested]
    worst = int(np.argmax(sizes))
    if sizes[worst] > capacity_bytes:
        model = profiles.names[int(requested[worst])]
        too_big = int(np.count_nonzero(sizes > capacity_bytes))
        more = f" ({too_big - 1} other requested model(s) too)" if too_big > 1 else ""
        raise SimulationInputError(
            profiles.source,
            f"model {model!r} needs {int(sizes[worst])} bytes, more than the whole capacity "
            f"of {capacity_bytes} bytes{more}",
        )


# -- CSV plumbing ---------------------------------------------------------------------------
def _read_header(source: str, required: tuple[str, ...]) -> list[str]:
    """The header's column names; raises on an empty file or a missing required column."""
    with open(source, newline="", encoding="utf-8-sig") as f:
        first = f.readline()
    if not first.strip():
        expected = ",".join(required)
        raise SimulationInputError(source, f"the file is empty (expected a header row {expected!r})")
    header = [name.strip() for name in next(csv.reader([first]))]
    missing = [c for c in required if c not in header]
    if missing:
        raise SimulationInputError(
            source,
            f"missing column(s) {', '.join(map(repr, missing))} in the header "
            f"(found: {', '.join(header)})",
            line=1,
        )
    for name in required:
        if header.count(name) > 1:
            raise SimulationInputError(source, f"column {name!r} appears twice in the header", line=1)
    return header


def _read_table(
    source: str, header: list[str], types: dict[str, pa.DataType], nullable: set[str] = frozenset()
) -> pa.Table:
    """The ``types`` columns of a CSV file as an Arrow table, parsed multi-threaded in C."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    try:
        table = pacsv.read_csv(
            source,
            read_options=pacsv.ReadOptions(column_names=header, skip_rows=1),
            parse_options=pacsv.ParseOptions(ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(
                column_types=types,
                include_columns=list(types),
                null_values=[""],
                strings_can_be_null=False,
            ),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
        _diagnose(source, header, types)
        raise SimulationInputError(source, str(exc).strip()) from None
    for name in types:
        column = table[name]
        if column.null_count and name not in nullable:
            row = int(np.argmax(column.is_null().to_numpy(zero_copy_only=False)))
            if all(table[c][row].as_py() in (None, "") for c in types):
                raise SimulationInputError(source, "empty row", line=row + 2)
            raise SimulationInputError(source, "missing value", line=row + 2, column=name)
    return table


def _diagnose(source: str, header: list[str], types: dict[str, pa.DataType]) -> None:
    """Find the first malformed row with Python's csv module and raise a precise error."""
    import pyarrow as pa

    numeric = {header.index(n): n for n, t in types.items() if pa.types.is_floating(t)}
    for line, row in csv_rows(source, len(header)):
        if isinstance(row, str):
            raise SimulationInputError(source, row, line=line)
        for i, name in numeric.items():
            text = row[i]
            if text == "":
                continue
            try:
                float(text)
            except ValueError:
                raise SimulationInputError(
                    source, f"{text!r} is not a number", line=line, column=name
                ) from None
            if text != text.strip():
                raise SimulationInputError(
                    source, f"{text!r} has spaces around the number", line=line, column=name
                )


def csv_rows(source: str | Path, fields: int) -> Iterator[tuple[int, list[str] | str]]:
    """(line, row) for each row after the header, read by Python's csv module (the
    readers' slow path, for the line of a problem): the row, or what is wrong with its
    number of fields ("empty row", "3 fields, the header has 4")."""
    with open(source, newline="", encoding="utf-8-sig", errors="replace") as f:
        reader = csv.reader(f)
        next(reader, None)
        for row in reader:
            if len(row) == fields:
                yield reader.line_num, row
            else:
                yield reader.line_num, ("empty row" if not row
                                        else f"{len(row)} fields, the header has {fields}")


def _floats(column: pa.ChunkedArray) -> np.ndarray:
    """A float64 column as a numpy array; nulls (where allowed) become NaN."""
    parts = [_to_numpy(chunk).astype(np.float64, copy=False) for chunk in column.chunks]
    return np.concatenate(parts) if parts else np.empty(0, np.float64)


def _to_numpy(array: pa.Array) -> np.ndarray:
    """``array`` as numpy: a fixed-width numeric array without nulls read off its data
    buffer, others by ``to_numpy``. (pyarrow's conversions import pandas, where it is
    installed, to look for pandas types: half a second of a simulation's start-up.)"""
    import pyarrow as pa

    if array.null_count == 0 and (pa.types.is_floating(array.type)
                                  or pa.types.is_integer(array.type)):
        dtype = np.dtype(array.type.to_pandas_dtype())
        return np.frombuffer(array.buffers()[1], dtype, len(array),
                             array.offset * dtype.itemsize)
    return array.to_numpy(zero_copy_only=False)


__all__ = [
    "PROFILE_COLUMNS",
    "TRACE_COLUMNS",
    "Profiles",
    "SimulationInputError",
    "Trace",
    "check_capacity",
    "cremebrulee_profiles_path",
    "csv_rows",
    "load_penalty",
    "make_profiles",
    "make_trace",
    "read_profiles",
    "read_trace",
]
