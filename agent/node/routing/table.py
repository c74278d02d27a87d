"""The routing table a node holds: the coordinator's ``agent.wire.RoutingTable`` and
when the coordinator last confirmed it. A table not confirmed for its ``max_age_s`` (or
``routing.max_table_age_s``, the shorter) is no longer trusted: the node then serves
every request itself, as if alone."""

from __future__ import annotations

from agent.wire import Directives, RoutingTable


class HeldTable:
    """The table held and its last confirmation (``now`` on the caller's clock)."""

    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self.table: RoutingTable | None = None
        self.confirmed_at: float | None = None

    @property
    def version(self) -> int | None:
        return self.table.version if self.table is not None else None

    def take(self, directives: Directives, now: float) -> None:
        """The routing part of a coordinator's answer: a new table, a confirmation of
        the one held (the same version), or none (no table at the coordinator, or a
        coordinator that does not route: the one held is dropped)."""
        version = directives.routing_version
        if directives.routing is not None and directives.routing.version == version:
            self.table, self.confirmed_at = directives.routing, now
        elif version is None:
            self.table, self.confirmed_at = None, None
        elif version == self.version:
            self.confirmed_at = now

    def age(self, now: float) -> float | None:
        return None if self.confirmed_at is None else now - self.confirmed_at

    def limit_s(self) -> float:
        """How old the table may grow: the shorter of its own and the node's limit."""
        own = self.table.max_age_s if self.table is not None else self.max_age_s
        return min(own, self.max_age_s)

    def current(self, now: float) -> RoutingTable | None:
        """The table while it is fresh enough to route by; else None."""
        if self.table is None or self.confirmed_at is None:
            return None
        return self.table if now - self.confirmed_at <= self.limit_s() else None
