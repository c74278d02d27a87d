"""A model version's lifecycle: its states, the one table of the moves between them,
and ``transition``, the only way to make a move.

The idea is TF Serving's ``LoaderHarness.TransitionState``: a move from a state the
caller did not expect, or one the table does not hold, raises ``IllegalTransition``
(a real exception, so ``python -O`` keeps the guard) and changes nothing.

    UNLOADED ──► LOADING ──► READY ──► UNLOADING ──► UNLOADED
                 │     │
                 │     └──► FAILED ──► LOADING    (retried)
                 │                 └─► UNLOADED   (forget_failure)
                 └──► UNLOADED   (gave up waiting for room, or cancelled)

An entry is forgotten (its model left the repository) only ``AT_REST``: nothing of it
is loaded and no task moves it.

LOADING has phases (``Lifecycle.phase``), which are not states (no move leads in or
out of one): ``downloading`` while a sourced model's files are pulled into the disk
tier (remote → disk), then none while the runtime loads them (disk → memory).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Collection
from dataclasses import dataclass, field


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

#: The phases of LOADING (``Lifecycle.phase``): its files being pulled from its source.
DOWNLOADING = "downloading"

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
    """Where one model version stands: its state (read-only; ``transition`` moves it),
    the task moving it now, and how its loads went."""

    model: str  # ``name:version``, for messages
    _state: State = field(default=State.UNLOADED, init=False)
    task: asyncio.Task | None = None  # its load or unload under way
    error: str | None = None
    failed_at: float | None = None  # cache clock of the last failed load (None: none)
    crashed: str | None = None      # why its runtime failed while running: reload it
    load_attempts: int = 0          # loads started, failed ones included
    failed_loads: int = 0           # loads (and pulls) that failed, since the agent started
    load_started: float | None = None  # cache clock at the start of the last load
    phase: str | None = None        # within LOADING: DOWNLOADING, or None
    failed_status: int = 503        # the HTTP status of the last failed load
    waiting_for_room: bool = False  # its load waits for a load slot or for room, now
    had_to_wait: bool = False       # the load under way waited (counted once, after)

    @property
    def state(self) -> State:
        return self._state


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
    if to is State.FAILED:
        life.failed_loads += 1
    return current
