"""Host paths out of the agent's error answers: a message may name a file the agent read
(in the repository, the data directory, a ``file://`` source), but a client learns only
a model's place in the repository (``resnet/config.yaml``), never where the box keeps
it (docs/operations.md: "never a host path"). The repository's messages are worded
relative already (``agent.node.repository``); ``hide`` is the last word on every 4xx and
5xx body and gRPC status, whatever raised it. The log keeps the full message.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import unquote, urlsplit

#: An absolute path under a top-level folder where hosts keep files (or a ``file://``
#: URL of one) that no known root covered: shown as ``.../<its last name>``. A path after
#: a word character, a dot or a slash is part of a URL or a name, not a host path.
_HOST_PATH = re.compile(
    r"(?:file://|(?<![\w./:-]))/(?:tmp|home|root|var|etc|opt|srv|mnt|media|run|usr|data|"
    r"work|nix|private|Users|Volumes)(?:/[^\s'\"(),;:]*)?")


def roots(config: Any, specs: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(host path, what a client reads instead), longest first: the repository roots and
    the disk tier's folder (a model's files: ``resnet/2/model.onnx``), the data
    directory (``data_dir/...``) and each ``file://`` source (``file://.../name``)."""
    found: dict[str, str] = {}
    for path in (config.repository, config.assigned_dir, config.models_dir):
        if path is not None:
            found[str(path).rstrip("/") + "/"] = ""
            found[str(path).rstrip("/")] = "."
    found.setdefault(str(config.data_dir).rstrip("/"), "data_dir")
    for spec in (specs or {}).values():
        source = getattr(spec.config, "source", None) or ""
        if source.lower().startswith("file://"):
            path = unquote(urlsplit(source).path).rstrip("/")
            if path:
                found.setdefault(f"file://{path}", f"file://.../{Path(path).name}")
                found.setdefault(path, f".../{Path(path).name}")
    return sorted(found.items(), key=lambda item: -len(item[0]))


def hide(text: str, known: Iterable[tuple[str, str]]) -> str:
    """``text`` with each known root replaced, then any other host path shortened to
    ``.../<last name>``."""
    for path, shown in known:
        if path in text:
            text = text.replace(path, shown)
    return _HOST_PATH.sub(_last_name, text)


def _last_name(match: re.Match) -> str:
    found = match.group(0)
    scheme = "file://" if found.startswith("file://") else ""
    return f"{scheme}.../{found.rstrip('/').rpartition('/')[2]}"


def public_message(node: Any, text: str) -> str:
    """``text`` as a client of ``node`` may read it (``hide`` with the node's roots; a
    text without a slash holds no path: the overload's 503s pass at once)."""
    if "/" not in text:
        return text
    return hide(text, roots(node.config, node.cache.specs))


def public_fields(node: Any, doc: dict, keys: tuple[str, ...] = ("error", "reason",
                                                                  "listing_error",
                                                                  "source")) -> dict:
    """``doc`` with its text ``keys`` as a client may read them (``public_message``)."""
    for key in keys:
        if isinstance(doc.get(key), str):
            doc[key] = public_message(node, doc[key])
    return doc
