"""A rollout: one model moved from one version (or digest) to another in waves, each
wave judged against the old version on the rest of the fleet in the same minutes, and
rolled back on a breach. This module is the rollout as data and its state machine as a
pure function (``step``: the rollout and what the nodes report in, the next rollout
out); ``agent.coordinator.rollouts`` runs it on the coordinator.

**Waves.** At the start the nodes that run the model (the plan's placement, then those
that report it) are split into waves: ``waves`` gives each wave's size in order (a
count of nodes, or a share such as ``"25%"`` of them, rounded up), the first being the
canary; the nodes left over form one last wave. The nodes of a wave, and every wave
before it, serve the new version; the others the old one. A wave is *switching* until
every live node of it reports serving the new version (a silent node is not waited
for: it catches up to its wave's version when it reports again), then *baking* for
``bake_s`` while the gates hold (judged over a window that begins ``settle_s`` into the
bake: a version's first answers after a switch are not its own); then the next wave
starts. After the last wave's bake
the rollout is completed and every node serves the new version. A node that begins to
serve the model during the rollout joins its last wave.

**Gates** (``Gates``), judged while a wave bakes over the counters each node reports
(``wire.VersionStat``, cumulative: the window is the difference since the bake began),
the new version on the nodes that switched against the old version on those that did
not (the last wave, where none did not, on errors and memory against the old version's
figures of the last window that had enough of them; its latency was judged against the
old version in the same minutes by the waves before):

* ``max_load_failures``: loads (or pulls) of the new version that failed on a node of
  a started wave, judged at once, in any phase;
* ``max_error_rate``: how far the new version's share of 5xx answers may exceed the
  old one's;
* ``max_latency_ratio``: the new version's latency at the model's SLO percentile over
  the old one's (and at least ``min_latency_increase_ms`` more, so that bucket noise at
  sub-millisecond latencies is no breach);
* ``max_memory_ratio``: the new version's measured size over the old one's (and at
  least ``min_memory_increase_mib`` more: small models measure noisily);
* ``min_requests``: the answers each side needs in the window before its error rate and
  latency are judged; latency also needs ``TAIL_ANSWERS`` beyond the percentile (p99:
  500 answers, p90: 50), or the percentile is one outlier. A wave whose bake ends
  before that is not judged on latency (a model without traffic is judged on loads and
  memory only).

A breach ends the rollout ``rolled_back`` with the reason; ``wave_timeout_s`` bounds how
long a live node of a wave may take to serve the new version (a breach too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

import msgspec
from msgspec import structs

from agent.schema import NonNegative, Positive, Section, setting
from agent.percentiles import histogram_quantile

RUNNING, PAUSED, COMPLETED, ROLLED_BACK, ABORTED = (
    "running", "paused", "completed", "rolled_back", "aborted")
ACTIVE = (RUNNING, PAUSED)
SWITCHING, BAKING = "switching", "baking"
MAX_WAVES = 100


def wave_sizes(v: Any) -> tuple[int | str, ...]:
    """``waves``: each wave's size, a count of nodes (>= 1) or a share (``"25%"``,
    above 0 and at most 100); at most ``MAX_WAVES``."""
    if not isinstance(v, (list, tuple)) or len(v) > MAX_WAVES:
        raise ValueError(f"must be a list of at most {MAX_WAVES} wave sizes: a count of "
                         f"nodes (1) or a share (\"25%\"), got {v!r}")
    out: list[int | str] = []
    for size in v:
        if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
            out.append(size)
            continue
        share = _share(size)
        if share is None:
            raise ValueError(f"each wave size must be a count of nodes >= 1 or a share "
                             f"such as \"25%\", got {size!r}")
        out.append(size)
    return tuple(out)


def _share(size: Any) -> float | None:
    """``"25%"`` -> 0.25; None when ``size`` is no share in (0, 100]."""
    if not isinstance(size, str) or not size.endswith("%"):
        return None
    try:
        share = float(size[:-1]) / 100.0
    except ValueError:
        return None
    return share if 0.0 < share <= 1.0 and math.isfinite(share) else None


class Gates(Section):
    """What a wave's new version must hold against the old one while it bakes."""

    max_error_rate: Annotated[float, setting(
        "how far the new version's share of 5xx answers may exceed the old one's "
        "(0.01: one point)", ge=0, le=1)] = 0.01
    max_latency_ratio: Annotated[Positive, setting(
        "the new version's latency at the model's SLO percentile over the old one's, "
        "at most")] = 1.5
    min_latency_increase_ms: Annotated[NonNegative, setting(
        "... and a breach only when it is at least this much more (bucket noise)")] = 1.0
    max_load_failures: Annotated[int, setting(
        "failed loads (or pulls) of the new version on a wave's nodes, at most; judged "
        "at once", ge=0)] = 0
    max_memory_ratio: Annotated[Positive | None, setting(
        "the new version's measured size over the old one's, at most (null: not "
        "judged)")] = 2.0
    min_memory_increase_mib: Annotated[NonNegative, setting(
        "... and a breach only when it is at least this many MiB more (measurement "
        "noise of small models)")] = 16.0
    min_requests: Annotated[int, setting(
        "answers each side needs in the window before its errors and latency are "
        "judged", ge=1)] = 20


class RolloutSettings(Section):
    """How a version rolls out: the coordinator config's ``rollout:`` (the defaults), a
    catalog entry's ``rollout`` or a ``POST /v1/rollouts`` body (each over the one
    before)."""

    waves: Annotated[tuple[int | str, ...], setting(
        "each wave's size in order, the first the canary: a count of nodes or a share "
        "(\"25%\") of the model's nodes; the nodes left over form one last wave ([]: "
        "one wave of every node)", check=wave_sizes)] = (1, "50%")
    bake_s: Annotated[NonNegative, setting(
        "seconds each wave serves the new version, its gates holding, before the "
        "next wave starts")] = 60.0
    settle_s: Annotated[NonNegative, setting(
        "seconds of the bake before its window begins: the first answers after a "
        "switch (a version's first runs, the old one's unload) are not judged")] = 2.0
    wave_timeout_s: Annotated[Positive, setting(
        "seconds a live node of a wave may take to serve the new version (pull and "
        "load) before the rollout is rolled back")] = 300.0
    traffic_share: Annotated[Annotated[float, msgspec.Meta(ge=0.01, le=0.99)] | None,
                             setting(
        "the share of the model's routed requests the nodes on the new version carry "
        "while others serve the old one, 0.01 to 0.99 (null: as the plan's replicas "
        "weigh them; routing nodes only)", example=0.5, commented=True)] = None
    gates: Annotated[Gates, setting("the gates each wave is judged by")] = \
        msgspec.field(default_factory=Gates)


def split_waves(nodes: list[str], sizes: tuple[int | str, ...]) -> list[list[str]]:
    """``nodes`` in order, cut into waves of ``sizes`` (counts, or shares of all the
    nodes rounded up, at least 1); the rest form one last wave. Empty waves are left
    out."""
    waves: list[list[str]] = []
    at = 0
    for size in sizes:
        if at >= len(nodes):
            break
        share = _share(size)
        count = max(1, math.ceil(share * len(nodes) - 1e-9)) if share is not None \
            else int(size)
        waves.append(nodes[at:at + count])
        at += count
    if at < len(nodes):
        waves.append(nodes[at:])
    return waves


# -- what the nodes report ------------------------------------------------------------


@dataclass(frozen=True)
class Counters:
    """One version's cumulative counters on one node (``wire.VersionStat``), or their
    difference over a window, or a sum of those: answers, 5xx answers, successes, failed
    loads, the successes' latency histogram (upper bound ms -> count, cumulative) and
    the measured size."""

    requests: float = 0.0
    errors: float = 0.0
    ok: float = 0.0
    load_failures: float = 0.0
    buckets: tuple[tuple[float, float], ...] = ()
    size_bytes: float = 0.0

    @classmethod
    def of(cls, stat: Any) -> "Counters":
        return cls(stat.requests, stat.errors, stat.ok, stat.load_failures,
                   tuple((float(le), float(c)) for le, c in stat.latency_buckets),
                   stat.size_bytes)

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "errors": self.errors, "ok": self.ok,
                "load_failures": self.load_failures,
                "buckets": [list(b) for b in self.buckets], "size_bytes": self.size_bytes}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "Counters":
        return cls(doc.get("requests", 0.0), doc.get("errors", 0.0), doc.get("ok", 0.0),
                   doc.get("load_failures", 0.0),
                   tuple((float(le), float(c)) for le, c in doc.get("buckets") or ()),
                   doc.get("size_bytes", 0.0))

    def since(self, base: "Counters | None") -> "Counters":
        """What was counted after ``base`` (all of it when the counters went back: the
        node restarted)."""
        if base is None or self.requests < base.requests or self.ok < base.ok \
                or self.load_failures < base.load_failures:
            return self
        before = dict(base.buckets)
        return Counters(self.requests - base.requests, self.errors - base.errors,
                        self.ok - base.ok, self.load_failures - base.load_failures,
                        tuple((le, c - before.get(le, 0.0)) for le, c in self.buckets),
                        self.size_bytes)

    def __add__(self, other: "Counters") -> "Counters":
        mine, theirs = dict(self.buckets), dict(other.buckets)
        return Counters(self.requests + other.requests, self.errors + other.errors,
                        self.ok + other.ok, self.load_failures + other.load_failures,
                        tuple(sorted((le, mine.get(le, 0.0) + theirs.get(le, 0.0))
                                     for le in mine.keys() | theirs.keys())),
                        max(self.size_bytes, other.size_bytes))

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests > 0 else None

    def latency_ms(self, percentile: float) -> float | None:
        """The latency at ``percentile`` (interpolated within the buckets; the
        successes above the last bound count as the last bound)."""
        if self.ok <= 0:
            return None
        return histogram_quantile(percentile / 100.0,
                                  [*self.buckets, (math.inf, self.ok)])

    def summary(self, percentile: float) -> dict[str, Any]:
        """For people: answers, errors, error rate, latency at ``percentile``, size."""
        latency = self.latency_ms(percentile)
        rate = self.error_rate
        return {"requests": self.requests, "errors": self.errors,
                "error_rate": None if rate is None else round(rate, 6),
                "latency_ms": None if latency is None else round(latency, 3),
                "size_bytes": self.size_bytes, "load_failures": self.load_failures}


@dataclass(frozen=True)
class NodeView:
    """What one node last reported of the model: whether it is live, the version it
    serves, each version's counters and why it cannot serve one (``errors``)."""

    alive: bool
    serving: int | None = None
    versions: dict[int, Counters] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)


#: Answers beyond the SLO percentile a side needs before its latency there is judged
#: (p99: 500 answers; p90: 50): with fewer, the percentile is one outlier.
TAIL_ANSWERS = 5


def latency_answers(gates: Gates, percentile: float) -> int:
    """The successes each side needs before latency at ``percentile`` is judged."""
    return max(gates.min_requests, math.ceil(TAIL_ANSWERS / (1.0 - percentile / 100.0) - 1e-9))


def judge(gates: Gates, new: Counters, old: Counters | None, percentile: float,
          same_time: bool = True) -> str | None:
    """Why ``new`` breaches ``gates`` against ``old`` (None: it holds). Latency only
    where ``old`` was measured in the same minutes (``same_time``): an earlier
    window's latency on a box whose load changed says nothing. Loads are judged by the
    caller, per node."""
    if old is not None and gates.max_memory_ratio is not None \
            and new.size_bytes > 0 and old.size_bytes > 0 \
            and new.size_bytes > gates.max_memory_ratio * old.size_bytes \
            and new.size_bytes - old.size_bytes >= gates.min_memory_increase_mib * 2**20:
        return (f"memory: the new version measures {new.size_bytes / 2**20:.1f} MiB, "
                f"over {gates.max_memory_ratio:g}x the old one's "
                f"{old.size_bytes / 2**20:.1f} MiB")
    if new.requests >= gates.min_requests:
        old_rate = old.error_rate if old is not None \
            and old.requests >= gates.min_requests else 0.0
        new_rate = new.error_rate or 0.0
        if new_rate - (old_rate or 0.0) > gates.max_error_rate:
            return (f"errors: {new_rate:.1%} of the new version's {new.requests:g} "
                    f"answers failed, the old one's {old_rate or 0.0:.1%} (at most "
                    f"{gates.max_error_rate:.1%} more)")
    needed = latency_answers(gates, percentile)
    if old is not None and same_time and new.ok >= needed and old.ok >= needed:
        mine, theirs = new.latency_ms(percentile), old.latency_ms(percentile)
        if mine is not None and theirs is not None \
                and mine > gates.max_latency_ratio * theirs \
                and mine - theirs >= gates.min_latency_increase_ms:
            return (f"latency: p{percentile:g} of the new version {mine:.1f} ms, "
                    f"{mine / theirs:.2f}x the old one's {theirs:.1f} ms (at most "
                    f"{gates.max_latency_ratio:g}x)")
    return None


# -- the rollout -----------------------------------------------------------------------


@dataclass(frozen=True)
class Rollout:
    """One rollout as stored (``to_json``) and shown (``GET /v1/rollouts``)."""

    id: int
    model: str
    from_version: int
    to_version: int
    settings: RolloutSettings
    waves: tuple[tuple[str, ...], ...]
    created: float
    from_digest: str | None = None
    to_digest: str | None = None
    percentile: float = 99.0  # the model's SLO percentile: the latency gate's
    state: str = RUNNING
    wave: int = 0  # index of the current wave
    phase: str = SWITCHING
    wave_started: float = 0.0
    bake_started: float | None = None
    #: node -> version -> its counters when the window began (``settle_s`` into the bake)
    baseline: dict[str, dict[int, Counters]] = field(default_factory=dict)
    settled: bool = False  # the bake's window has begun
    #: node -> the new version's failed loads before its wave began
    load_base: dict[str, float] = field(default_factory=dict)
    #: the old version's figures of the last window that had enough answers
    reference: Counters | None = None
    #: per wave: nodes, started, serving (all its live nodes on the new version),
    #: completed (its bake passed)
    history: tuple[dict[str, Any], ...] = ()
    figures: dict[str, Any] = field(default_factory=dict)  # the last window judged
    reason: str | None = None
    updated: float = 0.0

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def switched(self) -> set[str]:
        """The nodes of the waves started so far."""
        return {n for wave in self.waves[:self.wave + 1] for n in wave}

    def version_for(self, node: str) -> tuple[int, str | None]:
        """The version (and digest) ``node`` serves now under this rollout."""
        if self.state == COMPLETED or (self.active and node in self.switched()):
            return self.to_version, self.to_digest
        return self.from_version, self.from_digest

    def keep_for(self, node: str) -> tuple[int, ...]:
        """The versions ``node`` keeps at hand: the old one, where it switched, until
        the rollout ends."""
        if self.active and node in self.switched():
            return (self.from_version,)
        return ()

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "model": self.model, "state": self.state,
            "from": {"version": self.from_version, "digest": self.from_digest},
            "to": {"version": self.to_version, "digest": self.to_digest},
            "settings": structs.asdict(self.settings) | {
                "waves": list(self.settings.waves),
                "gates": structs.asdict(self.settings.gates)},
            "percentile": self.percentile,
            "waves": [list(w) for w in self.waves], "wave": self.wave + 1,
            "phase": self.phase,
            "wave_started": self.wave_started, "bake_started": self.bake_started,
            "settled": self.settled,
            "baseline": {n: {str(v): c.to_json() for v, c in row.items()}
                         for n, row in self.baseline.items()},
            "load_base": dict(self.load_base),
            "reference": self.reference.to_json() if self.reference else None,
            "history": [dict(h) for h in self.history], "figures": dict(self.figures),
            "reason": self.reason, "created": self.created, "updated": self.updated}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "Rollout":
        from agent.schema import load

        settings = load(RolloutSettings, doc["settings"])
        return cls(
            id=doc["id"], model=doc["model"], state=doc["state"],
            from_version=doc["from"]["version"], from_digest=doc["from"].get("digest"),
            to_version=doc["to"]["version"], to_digest=doc["to"].get("digest"),
            settings=settings, percentile=doc.get("percentile", 99.0),
            waves=tuple(tuple(w) for w in doc["waves"]), wave=doc["wave"] - 1,
            phase=doc.get("phase") or SWITCHING, wave_started=doc["wave_started"],
            bake_started=doc.get("bake_started"), settled=doc.get("settled", False),
            baseline={n: {int(v): Counters.from_json(c) for v, c in row.items()}
                      for n, row in (doc.get("baseline") or {}).items()},
            load_base=dict(doc.get("load_base") or {}),
            reference=Counters.from_json(doc["reference"]) if doc.get("reference") else None,
            history=tuple(doc.get("history") or ()), figures=doc.get("figures") or {},
            reason=doc.get("reason"), created=doc["created"], updated=doc.get("updated", 0.0))

    # -- the operator's moves ------------------------------------------------------------
    def paused(self, now: float) -> "Rollout":
        return replace(self, state=PAUSED, updated=now)

    def resumed(self, now: float) -> "Rollout":
        """Running again; the current wave switches (and bakes) again from now."""
        return replace(self, state=RUNNING, phase=SWITCHING, wave_started=now,
                       bake_started=None, settled=False, updated=now)

    def aborted(self, now: float, why: str) -> "Rollout":
        return replace(self, state=ABORTED, reason=why, updated=now)


def start_waves(nodes: list[str], view: dict[str, NodeView],
                settings: RolloutSettings) -> tuple[tuple[str, ...], ...]:
    """The waves of a rollout over ``nodes``: live nodes first (the canary is one that
    reports), then by name."""
    order = sorted(set(nodes), key=lambda n: (not (n in view and view[n].alive), n))
    return tuple(tuple(w) for w in split_waves(order, settings.waves))


def step(r: Rollout, view: dict[str, NodeView], now: float) -> Rollout:
    """The rollout after looking at what the nodes report now (``view``: node ->
    ``NodeView`` of this model). A paused or finished rollout is returned as it is."""
    if r.state != RUNNING:
        return r
    r = _joined(r, view)
    gates = r.settings.gates
    switched = r.switched()
    for node in sorted(switched):
        seen = view.get(node)
        counters = seen.versions.get(r.to_version) if seen is not None else None
        failures = 0.0
        if counters is not None:
            failures = counters.load_failures - r.load_base.get(node, 0.0)
            if failures < 0:  # the node restarted
                failures = counters.load_failures
        error = seen.errors.get(r.to_version) if seen is not None else None
        # a node that cannot pull or list the version has no failed load to count: its
        # error is one, where no failure is tolerated
        cannot = bool(error) and gates.max_load_failures == 0 \
            and seen is not None and seen.serving != r.to_version
        if failures > gates.max_load_failures or cannot:
            why = f"{node}: version {r.to_version} failed to load" + (
                f" ({failures:g} times)" if failures else "") + (f": {error}" if error else "")
            return _ended(r, ROLLED_BACK, why, now)
    if r.phase == SWITCHING:
        return _switching(r, view, now)
    return _baking(r, view, now)


def _joined(r: Rollout, view: dict[str, NodeView]) -> Rollout:
    """``r`` with the nodes that began to serve the model since it started (they
    report it, in no wave) in its last wave: judged with it, or switched at once where
    it has started."""
    known = {n for wave in r.waves for n in wave}
    newcomers = sorted(n for n, seen in view.items()
                       if n not in known and seen.serving is not None)
    if not newcomers or not r.waves:
        return r
    waves = (*r.waves[:-1], (*r.waves[-1], *newcomers))
    history = list(r.history)
    if r.wave == len(r.waves) - 1:
        history[-1] = {**history[-1], "nodes": list(waves[-1])}
    return replace(r, waves=waves, history=tuple(history))


def _ended(r: Rollout, state: str, why: str | None, now: float) -> Rollout:
    return replace(r, state=state, reason=why, updated=now)


def _snapshot(view: dict[str, NodeView]) -> dict[str, dict[int, Counters]]:
    return {n: dict(v.versions) for n, v in view.items() if v.versions}


def _switching(r: Rollout, view: dict[str, NodeView], now: float) -> Rollout:
    wave = r.waves[r.wave]
    live = [n for n in wave if n in view and view[n].alive]
    waiting = [n for n in live if view[n].serving != r.to_version]
    timed_out = now - r.wave_started > r.settings.wave_timeout_s
    if not waiting and (live or timed_out):  # (none live: a coordinator that just came
        # back has heard from no node yet; a wave all silent is not waited for forever)
        history = list(r.history)
        history[r.wave] = {**history[r.wave], "serving": now}
        settled = r.settings.settle_s <= 0  # else the window begins settle_s later
        return replace(r, phase=BAKING, bake_started=now, settled=settled,
                       baseline=_snapshot(view) if settled else {},
                       history=tuple(history), updated=now)
    if timed_out and waiting:
        return _ended(r, ROLLED_BACK, f"{', '.join(waiting)} did not serve version "
                      f"{r.to_version} within {r.settings.wave_timeout_s:g} s", now)
    return r


def _window(r: Rollout, view: dict[str, NodeView]) -> tuple[Counters, Counters]:
    """(the new version on the nodes that switched, the old one on the others) since
    the bake began."""
    switched = r.switched()
    new, old = Counters(), Counters()
    for node, seen in view.items():
        if not seen.alive:
            continue
        base = r.baseline.get(node, {})
        if node in switched and seen.serving == r.to_version:
            counters = seen.versions.get(r.to_version)
            if counters is not None:
                new = new + counters.since(base.get(r.to_version))
        elif node not in switched and seen.serving == r.from_version:
            counters = seen.versions.get(r.from_version)
            if counters is not None:
                old = old + counters.since(base.get(r.from_version))
    return new, old


def _baking(r: Rollout, view: dict[str, NodeView], now: float) -> Rollout:
    gates = r.settings.gates
    settled_at = (r.bake_started or now) + r.settings.settle_s
    if now < settled_at:
        return r
    if not r.settled:  # the window begins now
        r = replace(r, baseline=_snapshot(view), settled=True)
    new, old = _window(r, view)
    # the old version's size: where it serves, or is kept beside the new one
    old_size = max([seen.versions[r.from_version].size_bytes for seen in view.values()
                    if r.from_version in seen.versions] + [0.0])
    enough = old.requests >= gates.min_requests
    against = old if enough or r.reference is None else r.reference
    against = replace(against, size_bytes=old_size or against.size_bytes)
    reference = against if enough or r.reference is None else r.reference
    figures = {"new": new.summary(r.percentile), "old": against.summary(r.percentile),
               "window_s": round(now - settled_at, 3)}
    breach = judge(gates, new, against, r.percentile, same_time=enough)
    r = replace(r, reference=reference, figures=figures)
    if breach is not None:
        return _ended(r, ROLLED_BACK, breach, now)
    if now - (r.bake_started or now) < r.settings.bake_s:
        return r
    history = list(r.history)
    history[r.wave] = {**history[r.wave], "completed": now}
    if r.wave + 1 >= len(r.waves):
        return replace(r, state=COMPLETED, history=tuple(history), updated=now)
    nxt = r.wave + 1
    history.append({"wave": nxt + 1, "nodes": list(r.waves[nxt]), "started": now})
    load_base = dict(r.load_base)
    for node in r.waves[nxt]:
        counters = view[node].versions.get(r.to_version) if node in view else None
        load_base[node] = counters.load_failures if counters is not None else 0.0
    return replace(r, wave=nxt, phase=SWITCHING, wave_started=now, bake_started=None,
                   settled=False, history=tuple(history), load_base=load_base, updated=now)


def new_rollout(id: int, model: str, from_: tuple[int, str | None],
                to: tuple[int, str | None], settings: RolloutSettings, nodes: list[str],
                view: dict[str, NodeView], percentile: float, now: float) -> Rollout:
    """A rollout starting now over ``nodes``; its first wave started."""
    waves = start_waves(nodes, view, settings)
    history = ({"wave": 1, "nodes": list(waves[0]), "started": now},) if waves else ()
    load_base = {}
    for node in (waves[0] if waves else ()):
        counters = view[node].versions.get(to[0]) if node in view else None
        load_base[node] = counters.load_failures if counters is not None else 0.0
    rollout = Rollout(id=id, model=model, from_version=from_[0], from_digest=from_[1],
                      to_version=to[0], to_digest=to[1], settings=settings, waves=waves,
                      percentile=percentile, created=now, wave_started=now,
                      history=history, load_base=load_base, updated=now)
    return rollout if waves else replace(rollout, state=COMPLETED,
                                         reason="no node runs the model")
