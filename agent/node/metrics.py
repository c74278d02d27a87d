"""Prometheus metrics, in a registry of the app's own (no process globals).

Request counters and latency histograms are updated by handlers; cache counters and
memory gauges are read from the cache at scrape time by a collector, and batching, SLO
and prediction-cache figures from ``Serving`` the same way, so they can never drift from
what ``/v1/cache`` shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from agent.node.cache import Entry, ModelCache
    from agent.node.serving import Serving

_LATENCY_BUCKETS = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)
_LOAD_BUCKETS = (.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120)


class _CacheCollector(Collector):
    def __init__(self, cache: "ModelCache") -> None:
        self.cache = cache

    def collect(self) -> Iterator:
        counters = {k: CounterMetricFamily(f"edgeagent_cache_{k}", f"Cache {k} per model",
                                           labels=["model", "version"])
                    for k in ("hits", "misses", "evictions", "loads")}
        loaded = GaugeMetricFamily("edgeagent_model_loaded", "1 when the model is ready",
                                   labels=["model", "version", "device"])
        size = GaugeMetricFamily("edgeagent_model_size_bytes", "Accounted model size",
                                 labels=["model", "version", "device"])
        room_waits = CounterMetricFamily(
            "edgeagent_room_waits", "Loads of the model that waited for room",
            labels=["model", "version"])
        room_seconds = CounterMetricFamily(
            "edgeagent_room_wait_seconds", "Seconds the model's loads waited for room",
            labels=["model", "version"])
        waiting = GaugeMetricFamily(
            "edgeagent_load_waiting_requests",
            "Requests waiting for the model's load (and room for it)",
            labels=["model", "version"])
        for entry in self.cache.entries.values():
            labels = [entry.name, str(entry.version)]
            for k, fam in counters.items():
                fam.add_metric(labels, getattr(entry, k))
            room_waits.add_metric(labels, entry.room_waits)
            room_seconds.add_metric(labels, entry.room_wait_seconds)
            waiting.add_metric(labels, entry.in_flight if entry.state.value != "ready" else 0)
            ready = entry.state.value == "ready"
            loaded.add_metric(labels + [entry.device], 1.0 if ready else 0.0)
            size.add_metric(labels + [entry.device], entry.size_bytes if ready else 0)
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
        yield from (loaded, size, used, budget, queued, overhead, room_waits, room_seconds,
                    waiting)


class _ServingCollector(Collector):
    """Per model version: batch limit/window, queue, arrival rate, batch sizes and
    times, latency quantiles, SLO violations, drops, prediction cache hits/misses."""

    _GAUGES = {
        "batch_limit": "Current adaptive batch limit (rows)",
        "batch_window_ms": "Current delayed-batching window (ms)",
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
        labels = ["model", "version"]
        gauges = {k: GaugeMetricFamily(f"edgeagent_{k}", h, labels=labels)
                  for k, h in self._GAUGES.items()}
        counters = {k: CounterMetricFamily(f"edgeagent_{k}", h, labels=labels)
                    for k, h in self._COUNTERS.items()}
        batch_ms = GaugeMetricFamily("edgeagent_batch_processing_ms",
                                     "Mean processing time of a batch by its size (ms)",
                                     labels=labels + ["batch_size"])
        latency = GaugeMetricFamily("edgeagent_latency_ms",
                                    "Recent request latency quantiles (ms)",
                                    labels=labels + ["quantile"])
        slo = GaugeMetricFamily("edgeagent_slo_latency_ms", "SLO latency target (ms)",
                                labels=labels + ["percentile"])
        drops = CounterMetricFamily("edgeagent_drops", "Requests rejected with 503",
                                    labels=labels + ["reason"])
        pc = {k: CounterMetricFamily(f"edgeagent_prediction_cache_{k}",
                                     f"Prediction cache {k}", labels=labels)
              for k in ("hits", "misses")}
        pc_bytes = GaugeMetricFamily("edgeagent_prediction_cache_bytes",
                                     "Bytes held by the prediction cache", labels=labels)
        for (name, version), rt in list(self.serving.runtimes.items()):
            lv = [name, str(version)]
            d = rt.describe(self.serving.clock())
            for k, fam in gauges.items():
                if d[k] is not None:
                    fam.add_metric(lv, d[k])
            for k, fam in counters.items():
                fam.add_metric(lv, d[k])
            for size, ms in d["batch_ms_by_size"].items():
                batch_ms.add_metric(lv + [size], ms)
            for q, ms in d["latency_ms"].items():
                if ms is not None:
                    latency.add_metric(lv + [f"0.{q[1:]}"], ms)
            slo.add_metric(lv + [f"{d['slo_percentile']:g}"], d["slo_latency_ms"])
            for reason, n in d["drops"].items():
                drops.add_metric(lv + [reason], n)
            if d["prediction_cache"] is not None:
                for k, fam in pc.items():
                    fam.add_metric(lv, d["prediction_cache"][k])
                pc_bytes.add_metric(lv, d["prediction_cache"]["bytes"])
        yield from gauges.values()
        yield from counters.values()
        yield from (batch_ms, latency, slo, drops, *pc.values(), pc_bytes)


class Metrics:
    """The agent's metrics and their registry."""

    def __init__(self, cache: "ModelCache", serving: "Serving | None" = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("edgeagent_requests", "Inference requests",
                                ["model", "protocol", "code"], registry=self.registry)
        self.latency = Histogram("edgeagent_request_seconds", "Inference request latency",
                                 ["model"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.load_time = Histogram("edgeagent_model_load_seconds",
                                   "Model load time incl. first run", ["model"],
                                   buckets=_LOAD_BUCKETS, registry=self.registry)
        self.registry.register(_CacheCollector(cache))
        if serving is not None:
            self.registry.register(_ServingCollector(serving))
        cache.on_load.append(self._loaded)

    def _loaded(self, entry: "Entry") -> None:
        self.load_time.labels(entry.name).observe(entry.load_seconds)

    def observe(self, model: str, protocol: str, code: int, seconds: float | None) -> None:
        self.requests.labels(model, protocol, str(code)).inc()
        if seconds is not None:
            self.latency.labels(model).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
