"""Large numeric ``"data"`` arrays of a JSON infer body read straight into numpy arrays,
never as Python objects: parsed as objects, ``[1.5,2.5,...]`` costs about 32 bytes a
number (a float object and a list slot) for 4 bytes of text, and numpy's reading of
nested lists as much again. ``lift`` takes each such array out of the body (a
placeholder string in its place, so the rest parses as usual and small); ``numbers``
reads one into its tensor a piece at a time, checking that its brackets nest as the
tensor's shape says (or hold the numbers flat)."""

from __future__ import annotations

import math
import re

import numpy as np

from agent.backends.base import DATATYPES, InvalidInput
from agent.validation import load_json

#: A "data" array of numbers only (any nesting); from this size on it is lifted.
_NUMERIC_DATA = re.compile(rb'"data"\s*:\s*(\[[-+0-9.eE,\s\[\]]*\])')
LIFT_BYTES = 64 * 2**10
#: The placeholder that stands for lifted array ``i`` (a string no number decodes to).
_MARK = "\x00edgeagent-data-"
#: Text read at once: the objects one piece makes are bounded by it, not by the body.
_PIECE_BYTES = 256 * 2**10
_SPACE = b" \t\n\r"
_NUMBER = b"0123456789+-.eE"


class Lifted:
    """The arrays ``lift`` took out of a body: ``(start, end)`` offsets into it."""

    def __init__(self, body: bytes | bytearray, spans: list[tuple[int, int]]) -> None:
        self.body, self.spans = body, spans
        self.used: set[int] = set()

    def span_of(self, data: object) -> tuple[int, int] | None:
        """The span a placeholder stands for (once each); None for anything else."""
        if not (isinstance(data, str) and data.startswith(_MARK)):
            return None
        index = data[len(_MARK):]
        if not index.isdigit() or int(index) >= len(self.spans) or int(index) in self.used:
            raise InvalidInput("'data' holds a string the agent uses for itself")
        self.used.add(int(index))
        return self.spans[int(index)]


def lift(body: bytes | bytearray) -> tuple[bytes | bytearray, Lifted]:
    """(``body`` with each numeric "data" array of ``LIFT_BYTES`` or more replaced by a
    placeholder, the arrays taken out)."""
    spans: list[tuple[int, int]] = []
    if len(body) < LIFT_BYTES:  # no array in it is that large
        return body, Lifted(body, spans)
    pieces: list[bytes | memoryview] = []
    view, last = memoryview(body), 0
    for match in _NUMERIC_DATA.finditer(body):
        start, end = match.span(1)
        if end - start < LIFT_BYTES:
            continue
        pieces += [view[last:start], b'"\\u0000edgeagent-data-%d"' % len(spans)]
        spans.append((start, end))
        last = end
    if not spans:
        return body, Lifted(body, spans)
    pieces.append(view[last:])
    return b"".join(pieces), Lifted(body, spans)


def _skeleton(shape: tuple[int, ...]) -> bytes:
    """The brackets and commas of a JSON array nested as ``shape`` says."""
    inner = b""
    for size in reversed(shape):
        inner = b"[" + b",".join([inner] * size) + b"]" if inner else \
            b"[" + b"," * max(size - 1, 0) + b"]"
    return inner


def _parse_piece(text: bytes, name: str) -> list:
    """This piece's numbers as objects: as many as its text holds, no more."""
    try:
        return load_json(b"[" + text + b"]")
    except ValueError:
        raise InvalidInput(f"input {name!r}: 'data' holds something that is not a "
                           "number") from None


def _store(out: np.ndarray, filled: int, items: list, datatype: str, integers: bool,
           name: str) -> None:
    """Write ``items`` into ``out`` from ``filled``, in its datatype, checked."""
    try:
        parsed = np.array(items, np.uint64 if datatype == "UINT64" else
                          np.int64 if integers else np.float64)
        with np.errstate(over="raise", invalid="raise"):
            out[filled:filled + len(items)] = parsed.astype(out.dtype, casting="unsafe")
    except (FloatingPointError, OverflowError):
        raise InvalidInput(f"input {name!r}: values out of range for {datatype}") from None
    except (TypeError, ValueError):  # a nested list the brackets' removal left, a bool
        raise InvalidInput(f"input {name!r}: 'data' holds something that is not a "
                           "number") from None


def numbers(lifted: Lifted, span: tuple[int, int], datatype: str, shape: tuple[int, ...],
            name: str) -> np.ndarray:
    """Input ``name``'s tensor (``datatype``, ``shape``) from the array at ``span``;
    ``InvalidInput`` naming what is wrong (the count, the nesting, a number)."""
    body, (start, end) = lifted.body, span
    count = math.prod(shape)
    dtype = DATATYPES[datatype]
    integers = dtype.kind in "iu"
    flat = body.count(b"[", start, end) == 1
    expected = b"[" + b"," * max(count - 1, 0) + b"]" if flat else _skeleton(shape)
    out = np.empty(count, dtype)
    filled = seen = 0
    at = start
    while at < end:
        stop = body.find(b",", min(at + _PIECE_BYTES, end), end)
        stop = end if stop < 0 else stop
        raw = bytes(body[at:stop + 1 if stop < end else end])
        skeleton = raw.translate(None, _NUMBER + _SPACE)
        if expected[seen:seen + len(skeleton)] != skeleton:
            raise InvalidInput(f"input {name!r}: 'data' does not nest as shape "
                               f"{list(shape)} (or hold {count} numbers flat)")
        seen += len(skeleton)
        text = raw.translate(None, b"[]" + _SPACE).strip(b",")
        at = stop + 1
        if not text:
            continue
        if integers and any(c in text for c in (b".", b"e", b"E")):
            raise InvalidInput(f"input {name!r}: {datatype} data must be integers")
        items = _parse_piece(text, name)
        if filled + len(items) > count:
            raise InvalidInput(f"input {name!r}: more elements than shape {list(shape)} needs "
                               f"({count})")
        _store(out, filled, items, datatype, integers, name)
        filled += len(items)
    if filled != count or seen != len(expected):
        raise InvalidInput(f"input {name!r}: {filled} elements, shape {list(shape)} needs "
                           f"{count}")
    return out.reshape(shape)
