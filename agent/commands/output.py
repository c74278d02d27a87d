"""How commands print for people, one way for every command: tables that fit the terminal
(the least useful columns left out first; ``--wide`` keeps them all), ``-`` for what is
not known, sizes in binary units, moments in the local time zone, and a model's
``key value`` detail in the same words. ``--json`` prints the server's JSON as it is
(``show_json``), ISO 8601 times and all."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from collections.abc import Sequence
from typing import Any

import click

from agent.units import format_size

#: A moment as the servers' JSON gives it.
_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
#: Between two columns.
GAP = "  "
UNKNOWN = "-"


def terminal_width() -> int:
    """The terminal's columns (``$COLUMNS`` first; 100 where there is no terminal)."""
    return shutil.get_terminal_size((100, 24)).columns


def table(head: Sequence[str], rows: Sequence[Sequence[str]], *,
          drop_order: Sequence[str] = (), wide: bool = False,
          width: int | None = None) -> str:
    """Rows under ``head``, columns padded; unless ``wide``, the columns of
    ``drop_order`` (least useful first) are left out, one at a time, until the lines fit
    ``width`` (default: the terminal's); the others always stay."""
    keep = list(range(len(head)))
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in keep]
    limit = width or terminal_width()
    for name in ([] if wide else drop_order):
        if sum(widths[i] for i in keep) + len(GAP) * (len(keep) - 1) <= limit:
            break
        keep.remove(head.index(name))
    return "\n".join(GAP.join(str(r[i]).ljust(widths[i]) for i in keep).rstrip()
                     for r in [head, *rows])


def size(n: float | None) -> str:
    return UNKNOWN if n is None else format_size(n)


def number(x: float | None, spec: str = ".3g") -> str:
    return UNKNOWN if x is None else format(x, spec)


def local_time(value: str | float | None) -> str:
    """A moment (ISO 8601 as JSON gives it, or Unix seconds) in the local time zone, to
    the second: ``2026-11-29 04:42:42``."""
    if value is None or value == "":
        return UNKNOWN
    if isinstance(value, (int, float)):
        stamp = dt.datetime.fromtimestamp(value, dt.timezone.utc)
    else:
        try:
            stamp = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            return str(value)
    return stamp.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def age(seconds: float | None) -> str:
    """Seconds ago, as people say it: ``4s``, ``3m12s``, ``2h05m``, ``3d04h``."""
    if seconds is None:
        return UNKNOWN
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def value(key: str, v: Any) -> str:
    """One field of a server's JSON for people: sizes (``*_bytes``), moments (ISO 8601,
    as the servers give them) in local time, yes/no, ``-`` for null; lists and objects
    as compact JSON."""
    if v is None:
        return UNKNOWN
    if isinstance(v, bool):
        return "yes" if v else "no"
    if key.endswith("_bytes") and isinstance(v, (int, float)):
        return format_size(v)
    if isinstance(v, str) and _ISO.match(v):
        return local_time(v)
    if isinstance(v, float):
        return format(v, ".6g")
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(", ", ": "))
    return str(v)


def key_values(doc: dict[str, Any]) -> str:
    """``key  value`` lines (``value``), keys aligned."""
    width = max(map(len, doc), default=0)
    return "\n".join(f"{k.ljust(width)}  {value(k, v)}" for k, v in doc.items())


def show_json(doc: Any) -> None:
    """The server's JSON for machines, indented, ending in a newline."""
    click.echo(json.dumps(doc, indent=2))
