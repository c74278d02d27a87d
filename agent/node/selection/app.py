"""One selection app (Clipper §5): select members with its policy → call them through
the node's ordinary serving path (cache lease, batching, prediction cache, admission),
each with the app's deadline → combine whatever answered by the deadline → keep the
prediction for its feedback, which the policy learns from, per context if asked.

A member call carries the client's ``timeout`` as its hard deadline (admission drops
it early); against the app's SLO it is cut at the deadline rather than refused, since
admission judges a member by its own SLO and percentile (with a margin of its own
SLO), which would refuse a straggling member every time. A call cut is dropped while
queued (``expires``) and cancelled where its backend can stop midway.

A member that is not resident is not called (it would wait for a load): it counts as
missing (``cold``) and is loaded in the background only when it is worth it
(``agent.node.selection.memberloads``). Members that erred or missed the deadline learn a loss of 1;
members that were cold or shed are given their own recent loss (the mean, then a
moving average, of what they lost when they answered; the answering members' weighted
loss before they ever did: "sleeping experts"), so a member is judged by its answers, not its residence.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import uuid
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np

from agent.backends.base import DATATYPES, InvalidInput, TensorSpec
from agent.node.admission import Shed
from agent.node.cache import CacheError, ModelInvalid, UnknownModel
from agent.node.latency_stats import LatencyWindow
from agent.node.cache.lifecycle import State as Life
from agent.node.call import Answer, Call, Decoded
from agent.node.repository import ModelSpec
from agent.node.selection.feedback import PendingLog, Prediction
from agent.node.selection.memberloads import MemberLoads
from agent.node.selection.policies import LearnedState, SelectionPolicy, loss_of
from agent.node.selection.store import GLOBAL, SelectionStore

from agent.node.serving import resolve_settings

if TYPE_CHECKING:
    from agent.node.serving import Serving


class Elsewhere(Protocol):
    """Where a member runs when not here: the servable of the peer node the plan runs
    it on (``agent.node.frontdesk.PeerServable``), None where it runs here."""

    def __call__(self, name: str, version: int | None) -> Any: ...

log = logging.getLogger("edgeagent.selection")

#: A context names a user or session: at most this many characters.
MAX_CONTEXT = 256
#: The weight of each new row in a member's moving average of its loss.
USUAL_LOSS_RATE = 0.02
#: Members are cut before the deadline by the time the app recently took from the cut
#: to its answer (the loop waking up, combining; ``OVERRUN_PERCENTILE`` of the last
#: ``OVERRUN_WINDOW`` cut requests), at least ``ANSWER_MARGIN_S`` (encoding and writing
#: the answer) and at most a tenth of the budget: the answer is out by the deadline
#: rather than just after it.
ANSWER_MARGIN_S = 0.001
OVERRUN_WINDOW, OVERRUN_PERCENTILE = 200, 95
#: Answer times kept for ``describe`` (arrival to the answer combined).
ANSWER_WINDOW = 1000
#: Upper bounds of the confidence histogram's buckets.
CONFIDENCE_BUCKETS = (0.2, 0.4, 0.6, 0.8, 1.0)


def parse_candidate(text: str) -> tuple[str, int | None]:
    name, _, version = text.partition(":")
    return name, int(version) if version else None


class SelectionApp:
    """An app's members, policy, learned states (global and per context) and counters."""

    def __init__(self, spec: ModelSpec, *, store: SelectionStore | None,
                 clock: Callable[[], float], seed: int | None = None) -> None:
        options = spec.config.selection
        assert options is not None
        self.spec, self.options, self.store, self.clock = spec, options, store, clock
        self.name = spec.name
        self.members = [parse_candidate(c) for c in options.candidates]
        self.policy = SelectionPolicy(options.policy, len(self.members), eta=options.eta,
                             share=options.share, gamma=options.gamma,
                             epsilon=options.epsilon, discount=options.discount,
                             static_weights=tuple(options.weights))
        self.state = self.policy.fresh()
        self.contexts: OrderedDict[str, LearnedState] = OrderedDict()
        self.dirty: set[str] = set()           # contexts (GLOBAL too) to write
        self.unsaved: dict[str, LearnedState] = {}    # contexts evicted from memory, not written
        self.frozen = False                    # weights set by hand: no learning
        self.keys: list[str] | None = None     # members as name:version (``bind``)
        self.validated = False                 # members checked to agree (``ensure_valid``)
        self.inputs: list[TensorSpec] = []
        self.output: TensorSpec | None = None
        self.error: str | None = None          # a problem of its config (a missing member)
        self.pending = PendingLog(options.feedback.window_s, options.feedback.max_pending,
                                  clock)
        self.rng = random.Random(seed)
        self._validating = asyncio.Lock()
        self.loads = MemberLoads(self.name, options.load_min_weight)
        # counters (``describe``, ``/metrics``)
        self.requests = self.defaults = self.accepted = self.unmatched = 0
        self.selected: Counter[int] = Counter()
        self.answered: Counter[int] = Counter()
        self.missing: Counter[tuple[int, str]] = Counter()
        #: Each member's recent loss (the mean of its first 1/``USUAL_LOSS_RATE`` rows,
        #: then a moving average): what a member that was cold or shed is taken to have
        #: lost. ``loss_rows``: the rows it has been judged on.
        self.usual_loss: dict[int, float] = {}
        self.loss_rows: Counter[int] = Counter()
        self.confidence = [0] * len(CONFIDENCE_BUCKETS)
        self.confidence_sum = 0.0
        self.answer_times = LatencyWindow(ANSWER_WINDOW)
        self.overruns = LatencyWindow(OVERRUN_WINDOW)  # cut to answer, of cut requests

    # -- validation ---------------------------------------------------------------------
    async def ensure_valid(self, serving: Serving, elsewhere: Elsewhere | None = None
                           ) -> None:
        """Check once that the members exist and agree on inputs and output (loading a
        member never loaded before, to read its signature; a member the plan runs on a
        peer node, ``elsewhere``, is asked there instead); ``ModelInvalid`` (400)
        naming the mismatch. Then read the learned global state."""
        if self.validated:
            return
        async with self._validating:
            if self.validated:
                return
            if self.error:
                raise ModelInvalid(self.error)
            cache, seen = serving.cache, []
            for (name, version), text in zip(self.members, self.options.candidates):
                try:
                    entry = cache.entry(name, version)
                    peer = elsewhere(name, version) \
                        if elsewhere is not None and entry.metadata is None else None
                    if peer is not None:
                        seen.append((entry.key, await peer.metadata()))
                        continue
                    if entry.metadata is None:
                        entry = await cache.ensure_loaded(name, version)
                except UnknownModel:
                    raise ModelInvalid(f"app {self.name!r}: candidate {text!r} is not in the "
                                       "repository") from None
                except CacheError as exc:
                    raise ModelInvalid(f"app {self.name!r}: candidate {text!r} cannot load: "
                                       f"{exc}") from None
                seen.append((entry.key, entry.metadata or {}))
            self._check_signatures(seen)
            self.bind([key for key, _ in seen])
            self.validated = True

    def _check_signatures(self, seen: list[tuple[str, dict]]) -> None:
        want = self.options.output.name
        first_key, first = seen[0]
        for key, meta in seen:
            outputs = {o["name"]: o for o in meta.get("outputs", [])}
            if want not in outputs:
                raise ModelInvalid(f"app {self.name!r}: candidate {key} has no output "
                                   f"{want!r} (its outputs: {', '.join(outputs) or 'none'})")
            if meta.get("inputs") != first.get("inputs"):
                raise ModelInvalid(f"app {self.name!r}: candidates {first_key} and {key} take "
                                   f"different inputs: {_specs(first.get('inputs'))} vs "
                                   f"{_specs(meta.get('inputs'))}")
            mine = outputs[want]
            theirs = next(o for o in first["outputs"] if o["name"] == want)
            if (mine["datatype"], mine["shape"]) != (theirs["datatype"], theirs["shape"]):
                raise ModelInvalid(f"app {self.name!r}: candidates {first_key} and {key} "
                                   f"differ in output {want!r}: {_specs([theirs])} vs "
                                   f"{_specs([mine])}")
        self.inputs = [TensorSpec(s["name"], s["datatype"], tuple(s["shape"]))
                       for s in first["inputs"]]
        out = next(o for o in first["outputs"] if o["name"] == want)
        self.output = TensorSpec(want, out["datatype"], tuple(out["shape"]))
        if self.output.datatype not in DATATYPES or self.output.datatype == "BYTES":
            raise ModelInvalid(f"app {self.name!r}: output {want!r} is "
                               f"{self.output.datatype}; an app combines numbers")
        row = self.output.shape[1:]
        if all(d >= 0 for d in row) and len(self.options.default_output) not in (
                1, math.prod(row)):
            raise ModelInvalid(f"app {self.name!r}: default_output has "
                               f"{len(self.options.default_output)} values, output {want!r} "
                               f"rows have {math.prod(row)}")

    # -- states -------------------------------------------------------------------------
    def bind(self, keys: list[str]) -> None:
        """Name the members ``name:version`` (their versions resolved by the repository):
        the first time, read the learned global state back; when a version changed,
        carry every state over (the new version starts at the mean weight)."""
        if keys == self.keys:
            return
        if self.keys is None:
            self.keys = keys
            saved = self.store.read(self.name, GLOBAL) if self.store else None
            if saved is not None:
                self.state = self._from_saved(saved)
            return
        old, self.keys = self.keys, keys
        self.state = self.state.remap(old, keys)
        for context, state in list(self.contexts.items()):
            self.contexts[context] = state.remap(old, keys)
        self.unsaved = {c: s.remap(old, keys) for c, s in self.unsaved.items()}
        self.dirty |= {GLOBAL, *self.contexts, *self.unsaved}
        self.validated = False

    def _from_saved(self, saved: tuple[list[str], dict]) -> LearnedState:
        members, doc = saved
        try:
            return LearnedState.from_json(doc).remap(members, self.keys or [])
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            log.warning("app %s: a saved state does not read (%s); starting afresh",
                        self.name, exc)
            return self.state.copy()

    def state_for(self, context: str | None) -> LearnedState:
        """The state of ``context`` (None: the global one): in memory, else saved, else
        a copy of the global state; the least recently used contexts leave memory."""
        if context is None:
            return self.state
        state = self.contexts.get(context)
        if state is not None:
            self.contexts.move_to_end(context)
            return state
        state = self.unsaved.get(context)
        if state is None:
            saved = self.store.read(self.name, context) if self.store else None
            state = self._from_saved(saved) if saved is not None else self.state.copy()
        self.contexts[context] = state
        while len(self.contexts) > self.options.max_contexts:
            old, old_state = self.contexts.popitem(last=False)
            if old in self.dirty:
                self.unsaved[old] = old_state
        return state

    def context_of(self, parameters: dict[str, Any]) -> str | None:
        """The request's context parameter, checked (``InvalidInput`` naming it)."""
        raw = parameters.get(self.options.context_parameter)
        if raw is None:
            return None
        if isinstance(raw, bool) or not isinstance(raw, (str, int)):
            raise InvalidInput(f"parameter {self.options.context_parameter!r} must be a "
                               f"string, got {type(raw).__name__}")
        text = str(raw)
        if not 0 < len(text) <= MAX_CONTEXT:
            raise InvalidInput(f"parameter {self.options.context_parameter!r} must be 1 to "
                               f"{MAX_CONTEXT} characters, got {len(text)}")
        return text

    def rows_to_write(self) -> list[tuple[str, str, list[str], dict]]:
        """The states changed since the last call, as store rows (then marked clean)."""
        if self.keys is None:
            return []
        rows = []
        for context in sorted(self.dirty):
            state = self.state if context == GLOBAL else (
                self.contexts.get(context) or self.unsaved.get(context))
            if state is not None:
                rows.append((self.name, context, list(self.keys), state.as_json()))
        self.dirty.clear()
        self.unsaved.clear()
        return rows

    # -- serving ------------------------------------------------------------------------
    async def infer(self, serving: Serving, call: Call, elsewhere: Elsewhere | None = None
                    ) -> Answer:
        """The app's answer to ``call``, by its deadline: the combined output with its
        response parameters (confidence, members used and missing, default). A member
        the plan runs on a peer node (``elsewhere``) is called there, and counts as
        available."""
        await self.ensure_valid(serving, elsewhere)
        inputs = call.inputs.against(self.inputs)
        context = self.context_of(call.parameters)
        rid = call.request_id if call.request_id is not None else uuid.uuid4().hex
        slo = resolve_settings(self.spec.config, serving.config).slo
        budget = slo if call.timeout is None else min(slo, call.timeout)
        cut = call.arrived + budget - self._margin(budget)
        entries = [serving.cache.entry(n, v) for n, v in self.members]
        peers = [elsewhere(n, v) if elsewhere is not None else None for n, v in self.members]
        available = [e.state is Life.READY or peer is not None
                     for e, peer in zip(entries, peers)]
        state = self.state_for(context)
        asked, probs = self.policy.select(state, available, self.rng)
        weights = self.policy.probabilities(state)
        self.requests += 1
        rows = len(next(iter(inputs.values())))
        if rows == 0:
            raise InvalidInput(f"app {self.name!r}: a request needs at least one row")
        missing = {i: "cold" for i in asked if not available[i]}
        calls = {i: asyncio.ensure_future(self._call(serving, call, i, entries[i], peers[i],
                                                     inputs, cut))
                 for i in asked if available[i]}
        self.selected.update(asked)
        if calls:
            await asyncio.wait(calls.values(), timeout=max(cut - serving.clock(), 0.0))
        # after this request's member calls: a swap never unloads a member it is asking
        self.loads.consider(serving, entries, available, weights, self.answered)
        answers = self._collect(calls, entries, missing)
        outputs, answer = self._answer(rid, context, rows, asked, probs, answers, missing)
        now = serving.clock()
        self.answer_times.add(now - call.arrived)
        if "deadline" in missing.values():
            self.overruns.add(max(now - cut, 0.0))
        return Answer(outputs, self.name, 1, answer.pop("id"), answer)

    async def _call(self, serving: Serving, call: Call, i: int, entry: Any, peer: Any,
                    inputs: dict[str, np.ndarray], cut: float) -> dict[str, np.ndarray]:
        """Member ``i``'s outputs: served here with the client's timeout (dropped while
        queued past the cut), or by its peer node by the cut."""
        name, version = self.members[i]
        if peer is not None:
            member = Call(name, version, call.protocol, call.arrived, Decoded(inputs),
                          timeout=max(cut - serving.clock(), 1e-3))
            return (await peer.infer(member)).outputs
        member = Call(name, entry.version, call.protocol, call.arrived, Decoded(inputs),
                      timeout=call.timeout)
        return (await serving.infer(member, expires=cut))[1]

    def _collect(self, calls: dict[int, asyncio.Task], entries: list,
                 missing: dict[int, str]) -> dict[int, np.ndarray]:
        """The members' answers by the cut; those missing counted with their reason (a
        member cut at the deadline is dropped while queued, cancelled where it can)."""
        answers: dict[int, np.ndarray] = {}
        for i, task in calls.items():
            reason = _outcome(task)
            if reason is None:
                answers[i] = task.result()[self.options.output.name]
                self.answered[i] += 1
            else:
                missing[i] = reason
                if reason == "deadline":  # its outcome is not needed: queued, it never
                    task.add_done_callback(_quiet)  # runs (``expires``); running, it stops
                    if _cancellable(entries[i]):  # where its backend can stop midway
                        task.cancel()
        for i, reason in missing.items():
            self.missing[(i, reason)] += 1
        return answers

    def _margin(self, budget: float) -> float:
        """How long before the deadline members are cut (see ``ANSWER_MARGIN_S``)."""
        recent = self.overruns.percentile(OVERRUN_PERCENTILE) or 0.0
        return min(max(recent, ANSWER_MARGIN_S), budget / 10)

    def _answer(self, rid: str, context: str | None, rows: int, asked: list[int],
                probs: list[float], answers: dict[int, np.ndarray], missing: dict[int, str]
                ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        assert self.output is not None and self.keys is not None
        out = self.output
        default = np.broadcast_to(np.asarray(self.options.default_output,
                                             DATATYPES[out.datatype]),
                                  (rows, *(d if d >= 0 else 1 for d in out.shape[1:]))
                                  if len(self.options.default_output) == 1 else
                                  (rows, *out.shape[1:]))
        if answers:
            combined, agree = self.policy.combine(self.state_for(context), answers,
                                                  self.options.output.kind)
            confidence = agree / len(self.members)
            low = confidence < (self.options.min_confidence or 0.0)
            if low.any():
                combined = combined.copy()
                combined[low] = default[low].reshape(combined[low].shape)
        else:
            combined, confidence = np.array(default), np.zeros(rows)
            low = np.ones(rows, bool)
        lowest = float(confidence.min()) if rows else 0.0
        self.confidence_sum += lowest
        self.confidence[min(np.searchsorted(CONFIDENCE_BUCKETS, lowest),
                            len(CONFIDENCE_BUCKETS) - 1)] += 1
        used_default = bool(low.any())
        self.defaults += used_default
        self.pending.add(rid, Prediction(
            context, rows, dict(zip(asked, probs)), answers,
            tuple(i for i, r in missing.items() if r in ("deadline", "error")),
            tuple(i for i, r in missing.items() if r in ("cold", "shed")), self.clock()))
        params = {"confidence": round(lowest, 4),
                  "models_used": ",".join(self.keys[i] for i in sorted(answers)),
                  "missing": ",".join(f"{self.keys[i]}:{r}" for i, r in sorted(missing.items())),
                  "default": used_default}
        return {out.name: np.ascontiguousarray(combined)}, {"id": rid, **params}

    # -- feedback -----------------------------------------------------------------------
    def check_feedback(self, item: dict[str, Any], where: str
                       ) -> tuple[str, np.ndarray | None, np.ndarray | None, str | None]:
        """(id, labels, losses, context) of one feedback item; ``InvalidInput`` naming
        ``where`` and the problem. Row counts are checked against the prediction."""
        if not isinstance(item, dict):
            raise InvalidInput(f"{where}: must be a JSON object")
        unknown = sorted(set(item) - {"id", "labels", "losses", "context"})
        if unknown:
            raise InvalidInput(f"{where}: unknown field(s) {', '.join(unknown)} (expected id, "
                               "labels or losses, context)")
        rid = item.get("id")
        if not isinstance(rid, str) or not rid:
            raise InvalidInput(f"{where}: 'id' must be a non-empty string")
        context = self.context_of({self.options.context_parameter: item.get("context")})
        labels, losses = item.get("labels"), item.get("losses")
        if (labels is None) == (losses is None):
            raise InvalidInput(f"{where}: give either 'labels' (one per row) or 'losses' "
                               "(one per row, 0 to 1)")
        if losses is not None and self.policy.ensemble:
            raise InvalidInput(f"{where}: policy {self.policy.name} learns every member's "
                               "loss from 'labels'; 'losses' only suit one-member policies")
        values = labels if labels is not None else losses
        if not isinstance(values, list) or not values or any(
                isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                for v in values):
            raise InvalidInput(f"{where}: '{'labels' if labels is not None else 'losses'}' "
                               "must be a non-empty list of numbers")
        array = np.asarray(values, np.float64)
        if losses is not None and ((array < 0) | (array > 1)).any():
            raise InvalidInput(f"{where}: 'losses' must lie between 0 and 1")
        kind = self.options.output.kind
        if labels is not None and kind != "value":
            classes = self.output.shape[-1] if (
                self.output is not None and kind == "scores" and self.output.shape[-1] > 0) \
                else None
            if (array != np.round(array)).any() or (array < 0).any() or (
                    classes is not None and (array >= classes).any()):
                raise InvalidInput(f"{where}: 'labels' must be class ids, integers >= 0"
                                   + (f" and < {classes}" if classes else ""))
        prediction = self.pending.peek(rid)
        if prediction is not None and len(array) != prediction.rows:
            raise InvalidInput(f"{where}: {len(array)} value(s) for prediction {rid!r} of "
                               f"{prediction.rows} row(s): give one per row")
        return (rid, array if labels is not None else None,
                array if losses is not None else None, context)

    def learn(self, rid: str, labels: np.ndarray | None, losses: np.ndarray | None,
              context: str | None) -> bool:
        """Apply one checked feedback item; False when its prediction is unknown (never
        made, already given feedback, or fallen out of the log)."""
        prediction = self.pending.take(rid)
        if prediction is None:
            self.unmatched += 1
            return False
        self.accepted += 1
        if self.frozen:
            return True
        member_loss: dict[int, float] = {}
        kind = self.options.output.kind
        for i, answer in prediction.answers.items():
            member_loss[i] = float(loss_of(kind, answer, labels).mean()) if labels is not None \
                else float(losses.mean())
        for i in prediction.failed:
            member_loss[i] = 1.0
        for i, loss in member_loss.items():  # a plain mean while it has few rows: unbiased
            self.loss_rows[i] += prediction.rows
            new = max(prediction.rows / self.loss_rows[i],
                      1 - (1 - USUAL_LOSS_RATE) ** prediction.rows)
            self.usual_loss[i] = (1 - new) * self.usual_loss.get(i, loss) + new * loss
        context = context if context is not None else prediction.context
        for target in [context if context is not None else GLOBAL]:
            state = self.state_for(None if target == GLOBAL else target)
            learned = dict(member_loss)
            if self.policy.ensemble and prediction.answers:  # sleeping experts
                w = {i: state.weights[i] for i in prediction.answers}
                total = sum(w.values()) or 1.0
                mix = sum(w[i] * member_loss[i] for i in w) / total
                for i in prediction.sleeping:
                    learned[i] = self.usual_loss.get(i, mix)
            self.policy.observe(state, learned, prediction.rows, prediction.probabilities)
            self.dirty.add(target)
        return True

    # -- inspection ---------------------------------------------------------------------
    def peek_state(self, context: str) -> LearnedState | None:
        """``context``'s state if it has one (in memory or saved), without keeping it."""
        state = self.contexts.get(context) or self.unsaved.get(context)
        if state is None and self.store is not None and self.keys is not None:
            saved = self.store.read(self.name, context)
            state = self._from_saved(saved) if saved is not None else None
        return state

    def describe(self, context: str | None = None) -> dict[str, Any]:
        state = self.state
        if context is not None:
            found = self.peek_state(context)
            if found is None:
                raise UnknownModel(f"app {self.name!r} has no context {context!r}")
            state = found
        weights = self.policy.probabilities(state)
        keys = self.keys or list(self.options.candidates)
        members = []
        for i, key in enumerate(keys):
            members.append({
                "member": key, "weight": round(weights[i], 6),
                "observed": state.observed[i], "selected": self.selected[i],
                "answered": self.answered[i], "background_loads": self.loads.started[i],
                "missing": {r: n for (m, r), n in sorted(self.missing.items()) if m == i}})
        return {"app": self.name, "policy": self.policy.name, "context": context,
                "frozen": self.frozen, "validated": self.validated, "error": self.error,
                "members": members, "requests": self.requests, "default_answers": self.defaults,
                "feedback": {"accepted": self.accepted, "unmatched": self.unmatched,
                             "pending": len(self.pending), "expired": self.pending.expired,
                             "dropped": self.pending.dropped},
                "contexts_in_memory": len(self.contexts),
                "answer_ms": self._answer_ms(),
                "confidence_histogram": dict(zip(map(str, CONFIDENCE_BUCKETS),
                                                 self.confidence)),
                "confidence_mean": round(self.confidence_sum / sum(self.confidence), 4)
                if any(self.confidence) else None}

    def _answer_ms(self) -> dict[str, Any]:
        """Percentiles of the recent answer times (arrival to the answer combined), ms."""
        qs = self.answer_times.percentiles((50, 99, 100))
        return {"p50": _ms(qs[50]), "p99": _ms(qs[99]), "max": _ms(qs[100]),
                "of": len(self.answer_times)}

    def reset(self) -> None:
        """Forget what was learned (global and every context)."""
        self.state = self.policy.fresh()
        self.contexts.clear()
        self.unsaved.clear()
        self.dirty = {GLOBAL}
        self.frozen = False

    def set_weights(self, weights: list[float], freeze: bool) -> None:
        self.state.weights = [w / sum(weights) for w in weights]
        self.frozen = freeze
        self.dirty.add(GLOBAL)


def _specs(specs: list[dict] | None) -> str:
    return ", ".join(f"{s['name']} {s['datatype']} {list(s['shape'])}" for s in specs or []) \
        or "none"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _outcome(task: asyncio.Task) -> str | None:
    """None when the member answered, else why it is missing."""
    if not task.done():
        return "deadline"
    exc = task.exception()
    if exc is None:
        return None
    if isinstance(exc, Shed):
        return {"deadline": "deadline", "expired": "deadline", "cold": "cold"}.get(
            exc.reason, "shed")
    return "error"


def _cancellable(entry: Any) -> bool:
    """Whether a call to ``entry`` may be cancelled midway: its backend stops its work
    (others run on in a thread, and the call holds the model until they are done)."""
    backend = entry.backend
    return backend is not None and backend.CANCELLABLE


def _quiet(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()
