"""A selection app's cold members, loaded in the background when it is worth it: a
member not resident is never called (it would wait for a load), so it is loaded only
when it must be seen to be judged, or when it weighs clearly more than a resident
member, which it then displaces (unloaded first, once its requests are done, so that
the load does not evict a member that matters more). One load at a time per app;
near-ties load nothing: no thrash."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

from agent.node.cache import CacheError
from agent.node.cache.lifecycle import State

if TYPE_CHECKING:
    from agent.node.serving import Serving

log = logging.getLogger("edgeagent.selection")

#: A cold member that answered fewer times than this is loaded whatever its weight.
EXPLORE_ANSWERS = 20
#: A cold member displaces a resident one only when it weighs this many times more.
SWAP_MARGIN = 1.5
#: Seconds a swap waits for a lighter member in use to be done before it gives up (a
#: later request tries again).
SWAP_WAIT_S = 0.1


class MemberLoads:
    """The background loads of one app's members (``started``: per member, counted)."""

    def __init__(self, app: str, min_weight: float) -> None:
        self.app, self.min_weight = app, min_weight
        self.started: Counter[int] = Counter()
        self._loading: set[asyncio.Task] = set()

    def consider(self, serving: Serving, entries: list, available: list[bool],
                 weights: list[float], answered: Counter[int]) -> None:
        """Start loading (one at a time) the cold member most worth it: one that
        answered fewer than ``EXPLORE_ANSWERS`` times, or one weighing at least
        ``load_min_weight`` and ``SWAP_MARGIN`` times a resident member."""
        if self._loading:
            return
        resident = [weights[i] for i in range(len(entries)) if available[i]]
        floor = min(resident) if resident else -1.0
        worth = [i for i in range(len(entries)) if not available[i]
                 and entries[i].state is State.UNLOADED
                 and (answered[i] < EXPLORE_ANSWERS
                      or weights[i] >= max(self.min_weight, SWAP_MARGIN * floor))]
        if worth:
            i = max(worth, key=lambda j: (answered[j] < EXPLORE_ANSWERS, weights[j]))
            top = max(range(len(entries)), key=weights.__getitem__)
            exploring = answered[i] < EXPLORE_ANSWERS
            lighter = sorted((weights[j], j) for j in range(len(entries))
                             if available[j] and j != top and (
                                 weights[j] < weights[i] or exploring)
                             # one being seen is not displaced by another: no round robin
                             and not (exploring and answered[j] < EXPLORE_ANSWERS))
            self._load(serving, i, entries[i], [entries[j] for _, j in lighter])

    def _load(self, serving: Serving, i: int, entry: Any, lighter: list[Any]) -> None:
        """Load member ``i``; where its pool lacks room, first unload the app's resident
        members that weigh less (``lighter``, lightest first, each once its requests are
        done, within ``SWAP_WAIT_S``)."""
        self.started[i] += 1
        cache = serving.cache

        async def load() -> None:
            try:
                for victim in lighter:
                    if cache.has_room_for(entry):
                        break
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(cache.unload_when_idle(victim), SWAP_WAIT_S)
                if not cache.has_room_for(entry):  # the load would evict a member that
                    self.started[i] -= 1  # weighs more: not now
                    return
                await cache.ensure_loaded(entry.name, entry.version)
            except CacheError as exc:
                log.info("app %s: background load of %s failed: %s", self.app, entry.key, exc)

        task = asyncio.get_running_loop().create_task(load(), name=entry.key)
        self._loading.add(task)
        task.add_done_callback(self._loading.discard)
