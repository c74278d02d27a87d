"""Something decoded from each live node's stored report, kept from one read to the next.

With leases nearly every node is heard from between two reads of the fleet while few
send a new full report, so a reader that decodes every live node's stored summary at
every read spends its time decoding what it decoded last time. ``KeptNodes`` reads each
live node's name, ``last_seen`` and ``reported`` (``Store.live_marks``, from an index)
and decodes the summaries (or reports, where a node has none) of only the nodes whose
``reported`` differs from the one decoded: ``Store.node_summaries`` for a few, one scan
(``Store.live_nodes``) when most are new (the first read). Nodes no longer live (or
deleted) are dropped at each read.

It reads as decoding every row would: ``reported`` changes with each full report the
store keeps (``Store.write_reports``), except where a report replaces one with the very
same ``reported`` time, which a coordinator's clock does not give twice.
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

from agent.coordinator.store import Store

T = TypeVar("T")

#: A node's stored row decoded: ``decode(name, summary, report, reported)`` (``report``
#: only where there is no summary, as ``Store.node_summaries`` gives them).
Decode = Callable[[str, "str | bytes | None", "str | bytes | None", "float | None"], T]


class KeptNodes(Generic[T]):
    """Per live node, ``decode`` of its stored row as of the last ``live`` (see the
    module docstring); ``store``: the coordinator's ``Store``."""

    def __init__(self, store: Store, decode: Decode) -> None:
        self.store, self.decode = store, decode
        self.nodes: dict[str, tuple[float | None, T]] = {}  # name -> (reported, decoded)

    def clear(self) -> None:
        """Forget every node (the next read decodes them all)."""
        self.nodes = {}

    def live(self, since: float) -> list[tuple[str, float, T]]:
        """``(name, last_seen, decoded)`` of the nodes heard from at or after ``since``
        (in no particular order), decoding only the rows new since the last call; the
        nodes not among them are forgotten."""
        marks = self.store.live_marks(since)
        kept = self.nodes
        stale = {name for name, _, reported in marks
                 if (entry := kept.get(name)) is None or entry[0] != reported}
        if len(stale) > len(marks) // 2:  # most are new: one scan, not many lookups
            rows = [(name, summary, report, reported) for name, _, summary, report, reported
                    in self.store.live_nodes(since) if name in stale]
        else:
            rows = self.store.node_summaries(stale)
        fresh = {name: (reported, self.decode(name, summary, report, reported))
                 for name, summary, report, reported in rows}
        out, nodes = [], {}
        for name, seen, _ in marks:
            entry = fresh.get(name) if name in stale else kept[name]
            if entry is None:
                continue  # deleted since its mark was read
            nodes[name] = entry
            out.append((name, seen, entry[1]))
        self.nodes = nodes
        return out
