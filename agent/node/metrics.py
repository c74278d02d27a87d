"""Prometheus metrics, in a registry of the app's own (no process globals).

Request counters and latency histograms are updated by handlers; cache counters and
memory gauges are read from the cache at scrape time by a collector, so they can never
drift from what ``/v1/cache`` shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from agent.node.cache import Entry, ModelCache

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
        for entry in self.cache.entries.values():
            labels = [entry.name, str(entry.version)]
            for k, fam in counters.items():
                fam.add_metric(labels, getattr(entry, k))
            ready = entry.state.value == "ready"
            loaded.add_metric(labels + [entry.device], 1.0 if ready else 0.0)
            size.add_metric(labels + [entry.device], entry.size_bytes if ready else 0)
        used = GaugeMetricFamily("edgeagent_memory_used_bytes",
                                 "Bytes held by resident models", labels=["device"])
        budget = GaugeMetricFamily("edgeagent_memory_budget_bytes",
                                   "Byte budget for models", labels=["device"])
        for name, m in self.cache.memory().items():
            used.add_metric([name], m["used_bytes"])
            budget.add_metric([name], m["budget_bytes"])
        yield from counters.values()
        yield from (loaded, size, used, budget)


class Metrics:
    """The agent's metrics and their registry."""

    def __init__(self, cache: "ModelCache") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("edgeagent_requests", "Inference requests",
                                ["model", "protocol", "code"], registry=self.registry)
        self.latency = Histogram("edgeagent_request_seconds", "Inference request latency",
                                 ["model"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.load_time = Histogram("edgeagent_model_load_seconds",
                                   "Model load time incl. first run", ["model"],
                                   buckets=_LOAD_BUCKETS, registry=self.registry)
        self.registry.register(_CacheCollector(cache))
        cache.on_load.append(self._loaded)

    def _loaded(self, entry: "Entry") -> None:
        self.load_time.labels(entry.name).observe(entry.load_seconds)

    def observe(self, model: str, protocol: str, code: int, seconds: float | None) -> None:
        self.requests.labels(model, protocol, str(code)).inc()
        if seconds is not None:
            self.latency.labels(model).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
