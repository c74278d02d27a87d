"""Checks for everything read from outside: configuration files, node reports and
directives, request bodies, numbers in paths and headers.

A *checker* takes a value and returns it (converted where that is the point, e.g. sizes)
or raises ``ValueError`` with a message that reads after a key: ``must be a number > 0,
got 'fast'``. ``SchemaError`` is such a message with the dotted key it is about;
``ConfigError`` the same for a configuration file (it names the file first). The
declarations (``agent.schema``) word their errors with these checkers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Iterable

from agent.units import parse_size

Checker = Callable[[Any], Any]


class SchemaError(ValueError):
    """A value that breaks a schema; ``key`` is the dotted path to it (None: the whole)."""

    def __init__(self, key: str | None, message: str):
        super().__init__(f"{key}: {message}" if key else message)
        self.key, self.message = key, message


class ConfigError(SchemaError):
    """A configuration file is unreadable, has an unknown key or a bad value."""

    def __init__(self, file: str | Path | None, key: str | None, message: str):
        where = ": ".join(str(p) for p in (file, key) if p)
        ValueError.__init__(self, f"{where}: {message}" if where else message)
        self.file, self.key, self.message = file, key, message


# -- checkers: each takes the value, returns it converted or raises ValueError ----------


def number(lo: float | None = None, hi: float | None = None, *, strict_lo: bool = False,
           strict_hi: bool = False, integer: bool = False, finite: bool = False) -> Checker:
    """A number (``integer``: an int) within the bounds, inclusive unless ``strict_``;
    bools are not numbers. ``finite`` also refuses inf and nan."""
    bound = (f" > {lo:g}" if strict_lo else f" >= {lo:g}") if lo is not None else ""
    bound += (f" and < {hi:g}" if strict_hi else f" and <= {hi:g}") if hi is not None else ""
    what = f"{'an integer' if integer else 'a number'}{bound}"

    def check(v: Any) -> Any:
        ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
        try:  # an int too large for a float is not finite either
            bad = isinstance(v, bool) or not ok_type or finite and not math.isfinite(v) \
                or lo is not None and (v <= lo if strict_lo else v < lo) \
                or hi is not None and (v >= hi if strict_hi else v > hi)
        except OverflowError:
            bad = True
        if bad:
            shown = (f"an integer of {v.bit_length()} bits" if isinstance(v, int)
                     and v.bit_length() > 128 else repr(v))
            raise ValueError(f"must be {what}, got {shown}")
        return v
    return check


def boolean(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false, got {v!r}")
    return v


def choice(*options: str) -> Checker:
    """One of ``options`` (kept as the checker's ``options``: a flag offers them)."""
    def check(v: Any) -> str:
        if v not in options:
            raise ValueError(f"must be one of {', '.join(options)}, got {v!r}")
        return v
    check.options = options  # type: ignore[attr-defined]
    return check


def size(v: Any) -> int:
    """Bytes, as an integer or a string with a unit (``512MB``, ``2GiB``)."""
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError(f"must be a size such as 512MB or 2GiB, got {v!r}")
    return parse_size(v)


def string(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError(f"must be a non-empty string, got {v!r}")
    return v


def device(v: Any) -> str:
    """``cpu``, ``cuda`` (read as ``cuda:0``) or ``cuda:N``."""
    if v == "cpu" or v == "cuda" or (isinstance(v, str) and v.startswith("cuda:")
                                     and v[5:].isdigit()):
        return "cuda:0" if v == "cuda" else v
    raise ValueError(f"must be cpu, cuda or cuda:N, got {v!r}")


def json_object(v: Any) -> dict:
    if not isinstance(v, dict):
        raise ValueError(f"must be a JSON object, got {type(v).__name__}")
    return v


# -- applying checkers -------------------------------------------------------------------


def check(checker: Checker, value: Any, key: str | None) -> Any:
    """``checker(value)``, its ValueError raised as a ``SchemaError`` naming ``key``."""
    try:
        return checker(value)
    except SchemaError:
        raise
    except ValueError as exc:
        raise SchemaError(key, str(exc)) from None


#: Up to this many allowed keys an unknown one's message lists them all.
LIST_AT_MOST = 8


def only(data: dict, allowed: Iterable[str], prefix: str = "", noun: str = "key",
         listed_in: str | None = None) -> None:
    """Refuse a key of ``data`` that is not ``allowed``: the message suggests the nearest
    allowed ones (a typo), else lists them when they are few, else says where they are
    (``listed_in``)."""
    allowed = tuple(allowed)
    for key in data:
        if key not in allowed:
            raise SchemaError(f"{prefix}{key}",
                              f"unknown {noun} ({_nearest(key, allowed, noun, listed_in)})")


def _nearest(key: Any, allowed: tuple[str, ...], noun: str, listed_in: str | None) -> str:
    import difflib

    close = difflib.get_close_matches(str(key), allowed, n=2, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(close) + "?"
    if len(allowed) <= LIST_AT_MOST or listed_in is None:
        return f"expected one of: {', '.join(allowed)}"
    return f"none of the {len(allowed)} {noun}s here is close; {listed_in} lists them"


def unreadable(path: str | Path, key: str, exc: OSError) -> ConfigError:
    """A file that the configuration key ``key`` names and that cannot be read, in
    words: ``/etc/edgeagent/admin-token: admin_token_file: no such file``."""
    if isinstance(exc, FileNotFoundError):
        why = "no such file"
    elif isinstance(exc, IsADirectoryError):
        why = "a directory, not a file"
    elif isinstance(exc, PermissionError):
        why = "cannot read it (permission denied)"
    else:
        why = f"cannot read it ({exc.strerror or exc})"
    return ConfigError(path, key, why)


def load_yaml(path: Path) -> Any:
    """A YAML file's content; ``ConfigError`` when it cannot be read or parsed. (PyYAML
    is imported here: the declarations that name this module stay cheap to import.)"""
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, None, f"invalid YAML: {exc}") from None


# -- numbers from paths and headers, JSON bodies -----------------------------------------

#: The deepest nesting a JSON body may have (a v2 tensor's ``data`` nests once per
#: dimension; nothing legitimate comes close).
MAX_JSON_DEPTH = 64


def ascii_int(text: Any, what: str, max_digits: int = 18) -> int:
    """``text`` as a non-negative integer: ASCII decimal digits only (``"²".isdigit()``
    is true but ``int("²")`` fails; ``"٣"`` would parse as 3), at most ``max_digits``.
    Every number read from a URL path or a header goes through here."""
    if not (isinstance(text, str) and 0 < len(text) <= max_digits and text.isascii()
            and text.isdigit()):
        raise ValueError(f"{what} must be a decimal integer of at most {max_digits} "
                         f"ASCII digits, got {text!r}")
    return int(text)


def _depth_at_most(doc: Any, limit: int) -> bool:
    level, depth = [doc], 1  # the containers at ``depth``, one level at a time
    while level:
        if depth > limit:
            return False
        below = []
        for value in level:
            for c in (value.values() if isinstance(value, dict) else value):
                if isinstance(c, (list, dict)):
                    below.append(c)
        level, depth = below, depth + 1
    return True


def load_json(body: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse a JSON body from outside; ``ValueError`` naming the problem for anything
    that is not JSON, nests deeper than ``max_depth`` (a parser's or a later walk's
    RecursionError), or holds an integer past Python's digit limit. orjson first (it
    is several times faster; it refuses huge integers, NaN and BOMs), json for what it
    refuses."""
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    doc: Any = None
    try:
        import orjson
        doc = orjson.loads(body)
        parsed = True
    except ImportError:  # pragma: no cover - a declared dependency
        parsed = False
    except ValueError:  # orjson.JSONDecodeError
        parsed = False
    if not parsed:
        try:
            doc = json.loads(body)
        except RecursionError:
            raise ValueError(f"malformed JSON: nested deeper than {max_depth}") from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"malformed JSON: not UTF-8 ({exc.reason})") from None
        except ValueError as exc:  # JSONDecodeError, or an integer over the digit limit
            raise ValueError(f"malformed JSON: {exc}") from None
    # a body with fewer brackets than the limit cannot nest deeper; else walk it
    if isinstance(doc, (list, dict)) and body.count(b"[") + body.count(b"{") > max_depth \
            and not _depth_at_most(doc, max_depth):
        raise ValueError(f"malformed JSON: nested deeper than {max_depth}")
    return doc
