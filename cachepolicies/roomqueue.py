"""The room queue: loads (or pulls) waiting for bytes of one budget, granted in
deadline-then-arrival order as room appears, so that none starves.

One class for every place that waits for room: the node agent's memory tier (a load
waits for room for its peak), its disk tier (a pull waits for disk room) and the twin
(``cachepolicies.twin``), which replays the memory tier with the same verbs:

- ``ask``: join the queue (nothing is granted yet);
- ``changed``: what is free or evictable may have changed: grant the head, and the next,
  as far as room allows now. A later waiter never overtakes the head. Only the tier's own
  bookkeeping calls it (a lease ending, a load committing, an unload done, a pin lifted,
  a budget changed), never a caller that merely hopes;
- ``withdraw``: leave it (gave up, cancelled);
- ``wait``: ``ask`` and await the grant on the event loop, bounded by the deadline.

The queue holds no room and reads no clock (``now`` is passed in): its ``Room`` reserves
(``MemoryPool.reserve`` with the tier's rule of what may be evicted, starting the victims'
removal) and says when waiting is futile (nothing under way could ever free the room).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


@dataclass(order=True)
class Waiter:
    """One waiter for ``need`` bytes, until ``deadline`` (its tier's clock)."""

    deadline: float
    seq: int
    key: Hashable = field(compare=False)
    need: int = field(compare=False)
    #: What the room gave it (the victims, or their removals), once granted.
    granted: list | None = field(default=None, compare=False)
    #: It had to queue (was not granted when it asked).
    waited: bool = field(default=False, compare=False)
    future: asyncio.Future | None = field(default=None, compare=False, repr=False)


class Room(Protocol):
    """What a room queue asks of its tier."""

    def take(self, waiter: Waiter, now: float) -> list | None:
        """Reserve ``waiter.need`` bytes for it, taking victims as the tier allows and
        starting their removal: what the grant hands over, or None (no room now:
        nothing changed)."""

    def futile(self, waiter: Waiter) -> BaseException | None:
        """Why no lease, load or unload under way could ever make room for ``waiter``
        (it is refused with this), or None: waiting may end in room."""

    def give_back(self, waiter: Waiter) -> None:
        """A granted waiter went away before it used its room: free the reservation."""


class RoomTimeout(Exception):
    """A waiter's deadline passed before room was granted (it left the queue)."""


class RoomQueue:
    """The waiters of one budget, in deadline-then-arrival order."""

    def __init__(self, room: Room) -> None:
        self.room = room
        self._heap: list[Waiter] = []
        self._seq = itertools.count()
        self._granting = self._again = False

    def __len__(self) -> int:
        return len(self._heap)

    def waiting(self) -> list[Waiter]:
        """The waiters, head first."""
        return sorted(self._heap)

    def ask(self, key: Hashable, need: int, deadline: float) -> Waiter:
        """Join the queue; ``changed`` grants (the caller's bookkeeping calls it)."""
        waiter = Waiter(deadline, next(self._seq), key, need)
        heapq.heappush(self._heap, waiter)
        return waiter

    def withdraw(self, waiter: Waiter) -> None:
        """Leave the queue (a waiter granted meanwhile gives its room back)."""
        if waiter in self._heap:
            self._heap.remove(waiter)
            heapq.heapify(self._heap)
        elif waiter.granted is not None:
            self.room.give_back(waiter)

    def changed(self, now: float) -> None:
        """Grant the waiters in queue order as far as room allows now; a waiter for
        which waiting is futile is refused. A change told while granting (a victim's
        unload starting) is looked at once the grant is done."""
        if not self._heap:
            return
        if self._granting:
            self._again = True
            return
        self._granting = True
        try:
            self._again = True
            while self._again:
                self._again = False
                self._grant(now)
        finally:
            self._granting = False

    def _grant(self, now: float) -> None:
        while self._heap:
            head = self._heap[0]
            granted = self.room.take(head, now)
            if granted is None:
                why = self.room.futile(head)
                if why is None:
                    return
                heapq.heappop(self._heap)
                self._settle(head, None, why)
                continue
            heapq.heappop(self._heap)
            self._settle(head, granted, None)

    def _settle(self, waiter: Waiter, granted: list | None,
                why: BaseException | None) -> None:
        waiter.granted = granted
        future = waiter.future
        if future is None or future.done():
            return
        if why is None:
            future.set_result(granted)
        else:
            future.set_exception(why)

    async def wait(self, key: Hashable, need: int, deadline: float,
                   clock: Callable[[], float],
                   on_queued: Callable[[Waiter], Any] | None = None) -> Waiter:
        """Ask and await the grant: the waiter, granted (``granted`` holds what the room
        handed over). ``RoomTimeout`` at ``deadline``; what ``futile`` refused it with;
        a cancelled wait leaves the queue. ``on_queued`` is called once it has to wait."""
        waiter = self.ask(key, need, deadline)
        waiter.future = asyncio.get_running_loop().create_future()
        self.changed(clock())
        if not waiter.future.done():
            waiter.waited = True
            if on_queued is not None:
                on_queued(waiter)
            try:
                await asyncio.wait({waiter.future}, timeout=max(deadline - clock(), 0.0))
            except BaseException:
                self._leave(waiter, clock)
                raise
            if not waiter.future.done():
                self._leave(waiter, clock)
                raise RoomTimeout(f"{key} waited for {need} bytes until its deadline")
        waiter.future.result()  # raises what ``futile`` refused it with
        return waiter

    def _leave(self, waiter: Waiter, clock: Callable[[], float]) -> None:
        """A waiter gave up: out of the queue (its room back if it was granted
        meanwhile), and those behind it may go now."""
        future = waiter.future
        if future is not None and future.done() and not future.cancelled() \
                and future.exception() is not None:
            return  # refused: it holds nothing and left already
        self.withdraw(waiter)
        if future is not None and not future.done():
            future.cancel()
        self.changed(clock())
