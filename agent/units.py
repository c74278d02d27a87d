"""Byte sizes as people write them (``1048576``, ``512MB``, ``2GiB``, ``1.5 GB``), and
moments as JSON gives them (ISO 8601, UTC)."""

from __future__ import annotations

import datetime as dt
import re

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6,
    "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in ``text``; decimal units (KB, MB, GB, TB) and binary ones (KiB ... TiB)."""
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must be >= 0 bytes, got {text}")
        return text
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(
            f"bad size {text!r}: expected bytes or a number with a unit such as 512MB or 2GiB"
        )
    return int(round(float(match.group(1)) * _UNITS[unit]))


def exact_size(n: int) -> str:
    """``n`` bytes as the shortest text ``parse_size`` reads back exactly: ``64MiB``,
    ``1MB``, ``1500``."""
    for unit, factor in (("TiB", 2**40), ("TB", 10**12), ("GiB", 2**30), ("GB", 10**9),
                         ("MiB", 2**20), ("MB", 10**6), ("KiB", 2**10), ("KB", 10**3)):
        if n and n % factor == 0:
            return f"{n // factor}{unit}"
    return str(n)


def format_size(n: float) -> str:
    """A short human-readable size (binary units), e.g. ``1.5GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    raise AssertionError("unreachable")


def iso_time(seconds: float | None) -> str | None:
    """Unix ``seconds`` as an ISO 8601 UTC time to the millisecond
    (``2026-11-29T03:42:42.364Z``), the form every JSON answer gives a moment in; None
    stays None."""
    if seconds is None:
        return None
    stamp = dt.datetime.fromtimestamp(seconds, dt.timezone.utc)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")
