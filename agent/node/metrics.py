"""Prometheus metrics, in a registry of the app's own (no process globals).

Naming follows Prometheus' conventions: base units (``_seconds``, ``_bytes``), counters
end in ``_total``, latencies are histograms (``histogram_quantile`` gives any quantile),
and the default ``process_*`` / ``python_*`` collectors are registered on the same
registry. Labels: ``model``, ``version``, ``device`` on everything per model, and
``endpoint`` (``v2``, ``v2-grpc``, ``tfserving-rest``: the API a request came in
through, never the backend that ran it) and ``code`` on requests.

Request counters and latency histograms are updated by handlers (``observe``); cache
counters and memory gauges are read from the cache at scrape time by a collector, and
batching, SLO and prediction-cache figures from ``Serving`` the same way, so they can
never drift from what ``/v1/cache`` shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client import (
    CollectorRegistry, Counter, GCCollector, Histogram, PlatformCollector,
    ProcessCollector, generate_latest,
)
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)
from prometheus_client.registry import Collector

from agent.errors import AgentError
from agent.node.call import TF_REST, V2_GRPC, V2_REST
from agent.node.selection.app import CONFIDENCE_BUCKETS

if TYPE_CHECKING:
    from agent.http.body import BodyMemory
    from agent.node.cache import ModelCache
    from agent.node.cache.disktier import DiskTier
    from agent.node.cache.entry import Entry
    from agent.node.selection.apps import SelectionApps
    from agent.node.record import RequestRecord
    from agent.node.serving import Serving

#: The values of the ``endpoint`` label: the APIs a request can arrive through.
ENDPOINTS = (V2_REST, V2_GRPC, TF_REST)

_LATENCY_BUCKETS = (.0005, .001, .0025, .005, .01, .025, .05, .075, .1, .15, .2, .25, .5,
                    1, 2.5, 5, 10, 30)
_LOAD_BUCKETS = (.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120)
_MODEL = ["model", "version", "device"]


def _seconds(ms: float | None) -> float | None:
    """Milliseconds as ``Serving.describe`` gives them -> seconds."""
    return None if ms is None else ms / 1000.0


class _CacheCollector(Collector):
    def __init__(self, cache: "ModelCache") -> None:
        self.cache = cache

    def collect(self) -> Iterator:
        counters = {k: CounterMetricFamily(f"edgeagent_cache_{k}", help_, labels=_MODEL)
                    for k, help_ in (("hits", "Requests that found the model resident"),
                                     ("misses", "Requests that had to wait for a load"),
                                     ("evictions", "Times the model was evicted"),
                                     ("loads", "Successful loads of the model"))}
        loaded = GaugeMetricFamily("edgeagent_model_loaded", "1 when the model is ready",
                                   labels=_MODEL)
        pinned = GaugeMetricFamily("edgeagent_model_pinned", "1 when the model is pinned",
                                   labels=_MODEL)
        size = GaugeMetricFamily("edgeagent_model_size_bytes",
                                 "Accounted size of the resident model", labels=_MODEL)
        room_waits = CounterMetricFamily(
            "edgeagent_room_waits", "Loads of the model that waited for room", labels=_MODEL)
        room_seconds = CounterMetricFamily(
            "edgeagent_room_wait_seconds", "Seconds the model's loads waited for room",
            labels=_MODEL)
        waiting = GaugeMetricFamily(
            "edgeagent_load_waiting_requests",
            "Requests waiting for the model's load (and room for it)", labels=_MODEL)
        for entry in self.cache.entries.values():
            labels = [entry.name, str(entry.version), entry.device]
            for k, fam in counters.items():
                fam.add_metric(labels, getattr(entry.stats, k))
            room_waits.add_metric(labels, entry.stats.room_waits)
            room_seconds.add_metric(labels, entry.stats.room_wait_seconds)
            ready = entry.state.value == "ready"
            waiting.add_metric(labels, 0 if ready else entry.account.in_flight)
            loaded.add_metric(labels, 1.0 if ready else 0.0)
            pinned.add_metric(labels, 1.0 if entry.account.pinned else 0.0)
            size.add_metric(labels, entry.account.size_bytes if ready else 0)
        used = GaugeMetricFamily("edgeagent_memory_used_bytes",
                                 "Bytes held by resident models", labels=["device"])
        budget = GaugeMetricFamily("edgeagent_memory_budget_bytes",
                                   "Byte budget for models", labels=["device"])
        queued = GaugeMetricFamily("edgeagent_room_queue_length",
                                   "Loads waiting for room", labels=["device"])
        overhead = GaugeMetricFamily(
            "edgeagent_memory_overhead_bytes",
            "Bytes of the budget taken by the runtime itself (a GPU's CUDA context)",
            labels=["device"])
        for name, m in self.cache.memory().items():
            used.add_metric([name], m["used_bytes"])
            budget.add_metric([name], m["budget_bytes"])
            queued.add_metric([name], m["waiting_loads"])
            overhead.add_metric([name], m["overhead_bytes"])
        yield from counters.values()
        yield from (loaded, pinned, size, used, budget, queued, overhead, room_waits,
                    room_seconds, waiting)


class _ServingCollector(Collector):
    """Per model version: batch limit/window, queue, arrival rate, batch sizes and
    times, SLO target and violations, drops, prediction cache hits/misses."""

    _GAUGES = {
        "batch_limit": "Current adaptive batch limit (rows)",
        "batch_target": "Rows a batch waits for within the window",
        "mean_batch_size": "Mean rows per batch",
        "queue_length": "Requests waiting in the model's queue",
        "workers": "Workers running the model's batches",
        "arrival_rate": "Requests per second arriving (exponentially weighted)",
    }
    _COUNTERS = {
        "batches": "Batches run",
        "requests_served": "Requests answered with a result",
        "slo_violations": "Requests answered later than the SLO latency",
    }

    def __init__(self, serving: "Serving") -> None:
        self.serving = serving

    def collect(self) -> Iterator:
        gauges = {k: GaugeMetricFamily(f"edgeagent_{k}", h, labels=_MODEL)
                  for k, h in self._GAUGES.items()}
        counters = {k: CounterMetricFamily(f"edgeagent_{k}", h, labels=_MODEL)
                    for k, h in self._COUNTERS.items()}
        window = GaugeMetricFamily("edgeagent_batch_window_seconds",
                                   "Current delayed-batching window", labels=_MODEL)
        batch_s = GaugeMetricFamily(
            "edgeagent_batch_processing_seconds",
            "Mean processing time of a batch of this size (the batch tuner's profile)",
            labels=_MODEL + ["batch_size"])
        slo = GaugeMetricFamily("edgeagent_slo_latency_seconds",
                                "SLO latency target at the SLO percentile",
                                labels=_MODEL + ["percentile"])
        drops = CounterMetricFamily("edgeagent_drops", "Requests rejected with 503",
                                    labels=_MODEL + ["reason"])
        pc = {k: CounterMetricFamily(f"edgeagent_prediction_cache_{k}",
                                     f"Prediction cache {k}", labels=_MODEL)
              for k in ("hits", "misses")}
        pc_bytes = GaugeMetricFamily("edgeagent_prediction_cache_bytes",
                                     "Bytes held by the prediction cache", labels=_MODEL)
        entries = self.serving.cache.entries
        for (name, version), rt in list(self.serving.runtimes.items()):
            entry = entries.get((name, version))
            lv = [name, str(version), entry.device if entry is not None else ""]
            d = rt.describe(self.serving.clock())
            for k, fam in gauges.items():
                if d[k] is not None:
                    fam.add_metric(lv, d[k])
            for k, fam in counters.items():
                fam.add_metric(lv, d[k])
            window.add_metric(lv, _seconds(d["batch_window_ms"]))
            for batch_size, ms in d["batch_ms_by_size"].items():
                batch_s.add_metric(lv + [batch_size], _seconds(ms))
            if d["slo_latency_ms"] is not None:
                slo.add_metric(lv + [f"{d['slo_percentile']:g}"], _seconds(d["slo_latency_ms"]))
            for reason, n in d["drops"].items():
                drops.add_metric(lv + [reason], n)
            if d["prediction_cache"] is not None:
                for k, fam in pc.items():
                    fam.add_metric(lv, d["prediction_cache"][k])
                pc_bytes.add_metric(lv, d["prediction_cache"]["bytes"])
        yield from gauges.values()
        yield from counters.values()
        yield from (window, batch_s, slo, drops, *pc.values(), pc_bytes)


class _BodyMemoryCollector(Collector):
    """The bytes of request bodies in flight (``agent.http.body.BodyMemory``)."""

    def __init__(self, memory: "BodyMemory") -> None:
        self.memory = memory

    def collect(self) -> Iterator:
        m = self.memory.describe()
        yield GaugeMetricFamily("edgeagent_request_body_in_flight_bytes",
                                "Bytes of request bodies read or being read, not yet answered",
                                value=m["in_flight_bytes"])
        yield GaugeMetricFamily("edgeagent_request_body_limit_bytes",
                                "Bound on the bytes of request bodies in flight",
                                value=m["limit_bytes"])
        yield GaugeMetricFamily("edgeagent_request_body_waiting",
                                "Requests waiting for room for their body", value=m["waiting"])
        yield CounterMetricFamily("edgeagent_request_body_waits",
                                  "Requests that waited for room for their body",
                                  value=m["waits"])
        yield CounterMetricFamily("edgeagent_request_body_refused",
                                  "Requests answered 503 after waiting for room for their body",
                                  value=m["refused"])


class _SelectionCollector(Collector):
    """Per selection app and member: weight (global state), selected, answered, missing
    by reason; per app: feedback accepted/unmatched, default answers, confidence."""

    def __init__(self, apps: "SelectionApps") -> None:
        self.apps = apps

    def collect(self) -> Iterator:
        member = ["app", "member"]
        weight = GaugeMetricFamily("edgeagent_selection_member_weight",
                                   "The member's weight in the app's global state",
                                   labels=member)
        selected = CounterMetricFamily("edgeagent_selection_member_selected",
                                       "Requests the policy asked the member", labels=member)
        answered = CounterMetricFamily("edgeagent_selection_member_answered",
                                       "Requests the member answered by the deadline", labels=member)
        missing = CounterMetricFamily(
            "edgeagent_selection_member_missing",
            "Requests the member missed (deadline, cold, shed, error)",
            labels=[*member, "reason"])
        feedback = CounterMetricFamily(
            "edgeagent_selection_feedback", "Feedback items by outcome (accepted, unmatched)",
            labels=["app", "outcome"])
        defaults = CounterMetricFamily("edgeagent_selection_default_answers",
                                       "Answers that fell back to default_output",
                                       labels=["app"])
        confidence = HistogramMetricFamily(
            "edgeagent_selection_confidence",
            "Lowest confidence of each answer (share of members agreeing)", labels=["app"])
        for app in self.apps.apps.values():
            keys = app.keys or list(app.options.candidates)
            weights = app.policy.probabilities(app.state)
            for i, key in enumerate(keys):
                labels = [app.name, key]
                weight.add_metric(labels, weights[i])
                selected.add_metric(labels, app.selected[i])
                answered.add_metric(labels, app.answered[i])
                for reason in ("deadline", "cold", "shed", "error"):
                    missing.add_metric([*labels, reason], app.missing[(i, reason)])
            feedback.add_metric([app.name, "accepted"], app.accepted)
            feedback.add_metric([app.name, "unmatched"], app.unmatched)
            defaults.add_metric([app.name], app.defaults)
            cumulative, total = [], 0
            for bound, count in zip(CONFIDENCE_BUCKETS, app.confidence):
                total += count
                cumulative.append((str(bound), total))
            confidence.add_metric([app.name], [*cumulative[:-1], ("+Inf", total)],
                                  app.confidence_sum)
        yield from (weight, selected, answered, missing, feedback, defaults, confidence)


class _RecordCollector(Collector):
    """The size of the request record the twin reads (``agent.node.record``)."""

    def __init__(self, record: "RequestRecord") -> None:
        self.record = record

    def collect(self) -> Iterator:
        yield GaugeMetricFamily("edgeagent_record_requests",
                                "Requests held in the record for the twin (GET /v1/trace)",
                                value=len(self.record))
        yield GaugeMetricFamily("edgeagent_record_bytes",
                                "Bytes the request record holds (allocated at start)",
                                value=self.record.nbytes)


class _DiskCollector(Collector):
    """The disk tier (``agent.node.cache.disktier``): its budget, pulls and evictions, and per
    model version its bytes on disk, last download and the pull under way."""

    _VERSION = ["model", "version"]
    #: (metric, kind, help, ``DiskTier.summary`` key)
    _FIGURES = (
        ("edgeagent_disk_budget_bytes", GaugeMetricFamily,
         "Byte budget of the disk tier (pulled models' files)", "budget_bytes"),
        ("edgeagent_disk_used_bytes", GaugeMetricFamily,
         "Bytes of pulled models' files on disk", "used_bytes"),
        ("edgeagent_disk_pulls_in_progress", GaugeMetricFamily, "Pulls under way", "pulling"),
        ("edgeagent_disk_pulls_waiting", GaugeMetricFamily,
         "Pulls waiting for room in the disk budget", "waiting_pulls"),
        ("edgeagent_disk_pulls", CounterMetricFamily, "Model versions pulled", "pulls"),
        ("edgeagent_disk_pulled_bytes", CounterMetricFamily, "Bytes of model files pulled",
         "pulled_bytes"),
        ("edgeagent_disk_pull_failures", CounterMetricFamily, "Pulls that failed",
         "pull_failures"),
        ("edgeagent_disk_evictions", CounterMetricFamily,
         "Model versions whose files the disk tier evicted", "evictions"),
    )

    def __init__(self, disk: "DiskTier") -> None:
        self.disk = disk

    def collect(self) -> Iterator:
        s = self.disk.summary()
        for name, kind, help_, key in self._FIGURES:
            yield kind(name, help_, value=s[key])
        on_disk = GaugeMetricFamily("edgeagent_model_disk_bytes",
                                    "Bytes of the model version's files on disk",
                                    labels=self._VERSION)
        download = GaugeMetricFamily("edgeagent_model_download_seconds",
                                     "Seconds the model version's last download took",
                                     labels=self._VERSION)
        for h in self.disk.holdings():
            labels = [h["model"], str(h["version"])]
            on_disk.add_metric(labels, h["bytes"])
            download.add_metric(labels, h["download_seconds"])
        done = GaugeMetricFamily("edgeagent_model_download_progress_bytes",
                                 "Bytes pulled so far of the model version's download",
                                 labels=self._VERSION)
        total = GaugeMetricFamily("edgeagent_model_download_size_bytes",
                                  "Bytes the model version's download under way pulls",
                                  labels=self._VERSION)
        for p in self.disk.pulling():
            labels = [p["model"], str(p["version"])]
            done.add_metric(labels, p["bytes"])
            total.add_metric(labels, p["total_bytes"])
        yield from (on_disk, download, done, total)


class Metrics:
    """The agent's metrics and their registry (process and Python collectors included)."""

    def __init__(self, cache: "ModelCache", serving: "Serving | None" = None,
                 body_memory: "BodyMemory | None" = None,
                 selection: "SelectionApps | None" = None) -> None:
        self.cache = cache
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.requests = Counter("edgeagent_requests", "Inference requests by answer code",
                                ["model", "version", "device", "endpoint", "code"],
                                registry=self.registry)
        self.latency = Histogram("edgeagent_request_duration_seconds",
                                 "Latency of inference requests answered with a result",
                                 ["model", "version", "device", "endpoint"],
                                 buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.load_time = Histogram("edgeagent_model_load_duration_seconds",
                                   "Model load time incl. the first run", _MODEL,
                                   buckets=_LOAD_BUCKETS, registry=self.registry)
        self.registry.register(_CacheCollector(cache))
        if serving is not None:
            self.registry.register(_ServingCollector(serving))
            self.registry.register(_RecordCollector(serving.record))
        if body_memory is not None:
            self.registry.register(_BodyMemoryCollector(body_memory))
        if selection is not None:
            self.registry.register(_SelectionCollector(selection))
        if cache.disk is not None:
            self.registry.register(_DiskCollector(cache.disk))

    def model_loaded(self, entry: "Entry") -> None:
        """Count a load's time (the node hears of it from the cache)."""
        self.load_time.labels(entry.name, str(entry.version), entry.device).observe(
            entry.account.load_seconds)

    def observe(self, model: str, endpoint: str, code: int, seconds: float | None,
                version: int | None = None) -> None:
        """Count one inference request that came in through ``endpoint`` (one of
        ``ENDPOINTS``) and was answered with ``code``; ``seconds`` (None: not timed)
        goes into the latency histogram. ``model`` is a repository name or
        ``"<unknown>"``; ``version`` the one asked for (None: the default), labelled
        with its device; a version the model lacks is labelled ``""``."""
        try:
            entry = self.cache.entry(model, version)
            ver, device = str(entry.version), entry.device
        except AgentError:  # unknown model or version, a model without versions
            ver = device = ""
        self.requests.labels(model, ver, device, endpoint, str(code)).inc()
        if seconds is not None:
            self.latency.labels(model, ver, device, endpoint).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
