"""The agent's settings as its twin (``cachepolicies.twin.Queueing``) replays them: an
agent config's values (the declared defaults for an unflagged agent), then what a node's
record says of its models, then explicit overrides."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.config import AgentConfig
from agent.memory import PLAIN

if TYPE_CHECKING:
    from cachepolicies.twin import Queueing


def twin_settings(config: AgentConfig, recorded: dict[str, object] | None = None, *,
                  workers: int | None = None, load_concurrency: int | None = None,
                  max_concurrent_pulls: int | None = None,
                  pull_bandwidth: float | None = None) -> Queueing:
    """``config``'s load slots, workers, batching, SLO, ``load_wait_max_s``,
    ``cold_start`` and pulls (slots, bandwidth); ``recorded`` (a node's profiles:
    ``RECORDED``) over them; the keyword arguments over both where given."""
    from cachepolicies.twin import Queueing

    batching, recorded = config.batching, recorded or {}
    slo = float(recorded.get("slo_seconds") or config.slo.latency_ms / 1000)
    return Queueing(
        workers=workers or int(recorded.get("workers") or batching.workers),
        load_concurrency=load_concurrency or int(recorded.get("load_concurrency")
                                                 or config.load_concurrency),
        max_batch_size=int(recorded.get("max_batch_size")
                           or (batching.max_batch_size if batching.enabled else 1)),
        aimd_step=batching.aimd_step, batch_budget_seconds=slo * batching.budget_fraction,
        load_peak=float(recorded.get("load_peak") or PLAIN.load_peak),
        load_wait_max_s=config.load_wait_max_s, cold_start=config.cold_start,
        slo_seconds=slo,
        max_concurrent_pulls=max_concurrent_pulls or int(
            recorded.get("max_concurrent_pulls") or config.max_concurrent_pulls),
        pull_bandwidth=pull_bandwidth if pull_bandwidth is not None else
        recorded.get("pull_bandwidth") or config.pull_bandwidth)


#: A node's profile columns that set the twin, and how one value is taken for all its
#: models: the most workers, the largest batches, the tightest SLO, the highest peak
#: (and the node's load slots, pull slots and pull bandwidth, the same on every row).
RECORDED = {"workers": max, "max_batch_size": max, "slo_seconds": min, "load_peak": max,
            "load_concurrency": max, "max_concurrent_pulls": max, "pull_bandwidth": max}


def recorded_settings(rows: list[dict[str, object]]) -> dict[str, object]:
    """The twin's settings a node's profiles give (``RECORDED``; empty or unmeasured
    cells left out); raises ``ValueError`` naming a cell that is no number."""
    out: dict[str, object] = {}
    for column, pick in RECORDED.items():
        values = []
        for row in rows:
            cell = row.get(column)
            try:
                value = float("nan" if cell in (None, "") else cell)
            except (TypeError, ValueError):
                raise ValueError(f"column {column!r}: {cell!r} is not a number") from None
            if value == value and value > 0:
                values.append(value)
        if values:
            out[column] = pick(values)
    return out
