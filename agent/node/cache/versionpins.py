"""Which version of a model the node serves when a request names none, as the
coordinator's rollouts pin it (``agent.wire.ModelVersions``): the version decision as
a pure function, and the pins the cache holds (its catalog decides by them, its rollouts
roll to the version they name, its disk tier keeps the versions they keep).

Without a pin a model serves its newest version; a pin names the versions marked bad
(never served by default) and may name the one to serve: then exactly that one (while
the listing lacks it, the newest below it that is not bad: a node does not jump past
the version it was told while one below is at hand). Versions kept (``keep``) are not
unloaded after a switch away from them and their files are not evicted from the disk
tier: what a rollback switches back to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class VersionPin:
    """One model's pin: ``serve`` (None: the newest not bad), ``keep`` and ``bad``."""

    serve: int | None = None
    keep: frozenset[int] = frozenset()
    bad: frozenset[int] = frozenset()
    rollout: int | None = None

    @classmethod
    def of(cls, pin: Any) -> "VersionPin":
        """From a ``wire.ModelVersions`` (or anything with its fields)."""
        return cls(pin.serve, frozenset(pin.keep), frozenset(pin.bad), pin.rollout)

    def to_json(self) -> dict[str, Any]:
        return {"serve": self.serve, "keep": sorted(self.keep), "bad": sorted(self.bad),
                "rollout": self.rollout}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "VersionPin":
        return cls(doc.get("serve"), frozenset(doc.get("keep") or ()),
                   frozenset(doc.get("bad") or ()), doc.get("rollout"))


def served_version(versions: Iterable[int], pin: VersionPin | None) -> int | None:
    """The version served by default among ``versions`` (sorted or not) under ``pin``:
    the pinned one where listed; else the newest not bad, at most the pinned one where
    one below it is listed; None when none qualifies."""
    listed = sorted(versions)
    if pin is None:
        return listed[-1] if listed else None
    if pin.serve is not None and pin.serve in listed:
        return pin.serve
    good = [v for v in listed if v not in pin.bad]
    if pin.serve is not None:
        below = [v for v in good if v <= pin.serve]
        if below:
            return below[-1]
    return good[-1] if good else None


class VersionPins:
    """The pins of every pinned model (the reporter sets them from the coordinator's
    answers; the cache reads them)."""

    def __init__(self) -> None:
        self.pins: dict[str, VersionPin] = {}

    def get(self, name: str) -> VersionPin | None:
        return self.pins.get(name)

    def kept(self, name: str, version: int) -> bool:
        """``name:version`` is kept at hand (a rollout may switch back to it)."""
        pin = self.pins.get(name)
        return pin is not None and version in pin.keep

    def served(self, name: str, versions: Iterable[int]) -> int | None:
        return served_version(versions, self.pins.get(name))
