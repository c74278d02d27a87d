"""A model version's lifecycle: its states, the one table of the moves between them,
``transition``, the only way to make a move, and the named moves that make one together
with its companion fields (TF Serving's ``LoaderHarness``: ``Load`` sets the state and
its status at once).

A move from a state the caller did not expect, or one the table does not hold, raises
``IllegalTransition`` (a real exception, so ``python -O`` keeps the guard) and changes
nothing.

    UNLOADED ──► LOADING ──► READY ──► UNLOADING ──► UNLOADED
                 │     │
                 │     └──► FAILED ──► LOADING    (retried)
                 │                 └─► UNLOADED   (forget_failure)
                 └──► UNLOADED   (gave up waiting for room, or cancelled)

An entry is forgotten (its model left the repository) only ``AT_REST``: nothing of it
is loaded and no task moves it.

LOADING has phases (``Phase``), which are not states (no move leads in or out of one):
``downloading`` while a sourced model's files are pulled into the disk tier (remote →
disk), ``waiting_for_slot`` and ``waiting_for_room`` while its load waits for a load slot
and for room, ``room_granted`` once room is reserved (TF Serving's ``kLoadApproved``:
it waits for the pool's unloads, then the runtime loads it); none between them.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Callable


class State(str, enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"
    FAILED = "failed"


#: Every legal move: the states each state may go to, and no others.
TRANSITIONS: dict[State, frozenset[State]] = {
    State.UNLOADED: frozenset({State.LOADING}),
    # loaded; the load failed; it gave up waiting for room (503) or was cancelled
    State.LOADING: frozenset({State.READY, State.FAILED, State.UNLOADED}),
    State.READY: frozenset({State.UNLOADING}),  # evicted, idle, crashed or removed
    State.UNLOADING: frozenset({State.UNLOADED}),
    State.FAILED: frozenset({State.LOADING, State.UNLOADED}),  # retried; forgotten
}


class Phase(str, enum.Enum):
    """Where a LOADING model's load stands (``Lifecycle.phase``)."""

    DOWNLOADING = "downloading"            # its files pulled into the disk tier
    WAITING_FOR_SLOT = "waiting_for_slot"  # behind other loads (``load_concurrency``)
    WAITING_FOR_ROOM = "waiting_for_room"  # in its pool's room queue
    ROOM_GRANTED = "room_granted"          # room reserved: unloads, then the runtime


#: The phases in which a load waits (``waiting_for_room`` in ``/v1/cache``).
WAITING = frozenset({Phase.WAITING_FOR_SLOT, Phase.WAITING_FOR_ROOM})

#: The states in which the cache may drop an entry whose model left the repository.
AT_REST = frozenset({State.UNLOADED, State.FAILED})


class IllegalTransition(RuntimeError):
    """A move the table does not hold, or from a state the caller did not expect: a bug
    in the cache, never a request's fault."""

    def __init__(self, model: str, current: State, to: State, why: str) -> None:
        super().__init__(f"model {model}: illegal move {current.value} -> {to.value}: {why}")
        self.model, self.current, self.to = model, current, to


@dataclass
class Lifecycle:
    """Where one model version stands: its state (read-only; the named moves below, each
    through ``transition``, move it), the task moving it now, and how its loads went.
    ``on_move`` is told after each named move (the entry tells its tiers)."""

    model: str  # ``name:version``, for messages
    on_move: Callable[[], None] = field(default=lambda: None, repr=False, compare=False)
    _state: State = field(default=State.UNLOADED, init=False)
    task: asyncio.Task | None = None  # its load or unload under way
    error: str | None = None
    failed_at: float | None = None  # cache clock of the last failed load (None: none)
    crashed: str | None = None      # why its runtime failed while running: reload it
    load_attempts: int = 0          # loads started, failed ones included
    failed_loads: int = 0           # loads that failed, since the agent started
    load_started: float | None = None  # cache clock at the start of the last load
    phase: Phase | None = None      # within LOADING (``Phase``), or None
    failed_status: int = 503        # the HTTP status of the last failed load
    had_to_wait: bool = False       # the load under way waited (counted once, after)

    @property
    def state(self) -> State:
        return self._state

    @property
    def waiting_for_room(self) -> bool:
        """Its load waits for a load slot or for room, now."""
        return self.phase in WAITING

    # -- the moves ---------------------------------------------------------------------
    def begin_load(self, now: float) -> None:
        """UNLOADED or FAILED -> LOADING: a new attempt, its error cleared."""
        transition(self, State.LOADING, expected_from=(State.UNLOADED, State.FAILED))
        self.error, self.load_started = None, now
        self.load_attempts += 1
        self.on_move()

    def loaded(self) -> None:
        """LOADING -> READY."""
        transition(self, State.READY, expected_from=State.LOADING)
        self.on_move()

    def load_failed(self, error: str, *, at: float | None = None, status: int = 503) -> None:
        """LOADING -> FAILED with why, remembered from ``at`` (None: not remembered,
        tried again by the next request) and the status a request gets meanwhile."""
        transition(self, State.FAILED, expected_from=State.LOADING)
        self.error, self.failed_at, self.failed_status = error, at, status
        self.failed_loads += 1
        self.on_move()

    def gave_up(self, error: str | None) -> None:
        """LOADING -> UNLOADED: no room in time (``error``), or cancelled (None)."""
        transition(self, State.UNLOADED, expected_from=State.LOADING)
        self.error = error
        self.on_move()

    def begin_unload(self) -> None:
        """READY -> UNLOADING; a crash that asked for it is dealt with."""
        transition(self, State.UNLOADING, expected_from=State.READY)
        self.crashed = None
        self.on_move()

    def unloaded(self) -> None:
        """UNLOADING -> UNLOADED, its unload task done."""
        self.task = None
        transition(self, State.UNLOADED, expected_from=State.UNLOADING)
        self.on_move()

    def forget_failure(self) -> None:
        """FAILED -> UNLOADED, the failure forgotten: the next request loads at once."""
        transition(self, State.UNLOADED, expected_from=State.FAILED)
        self.error, self.failed_at = None, None
        self.on_move()


def transition(life: Lifecycle, to: State, *,
               expected_from: State | Collection[State]) -> State:
    """Move ``life`` to ``to`` from one of ``expected_from``; returns the state it left.
    ``IllegalTransition`` (nothing changed) when it stands elsewhere or the table has
    no such move."""
    current = life._state
    expected = (expected_from,) if isinstance(expected_from, State) else expected_from
    if current not in expected:
        raise IllegalTransition(life.model, current, to, "expected from "
                                + " or ".join(s.value for s in expected))
    if to not in TRANSITIONS[current]:
        raise IllegalTransition(life.model, current, to, "not in the transition table")
    life._state = to
    life.phase = None
    return current
