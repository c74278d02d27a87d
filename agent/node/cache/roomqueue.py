"""A waiter in a room queue: a load (memory tier) or a pull (disk tier) waiting for
``need`` bytes of a budget, granted in deadline-then-arrival order so none starves."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass(order=True)
class RoomRequest:
    """One waiter for ``need`` bytes; ``future`` gets the grant (or why it never can)."""

    deadline: float
    seq: int
    key: tuple[str, int] = field(compare=False)
    need: int = field(compare=False)
    future: asyncio.Future = field(compare=False)
