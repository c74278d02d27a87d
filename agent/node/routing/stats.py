"""What routing did, per model and peer: requests forwarded and the answers they got,
forwards that failed, fallbacks to serving here (and why), requests peers forwarded
here, and the latency of a hop. Cumulative since start: ``/metrics`` shows them as
counters and histograms' quantiles are the dashboard's; the reporter sends the
differences between two reports."""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agent.node.latency_stats import LatencyWindow

#: Why a request planned elsewhere was served here.
FALLBACK_REASONS = ("stale_table", "peers_down", "peer_failed", "peer_busy")
HOP_WINDOW = 1024  # hop latencies kept per model and peer


class PeerStats:
    """One model's traffic to one peer."""

    def __init__(self) -> None:
        self.answers: Counter[int] = Counter()  # the peer's answers by HTTP status
        self.errors = 0  # forwards that failed (refused, timed out, 5xx...)
        self.hop = LatencyWindow(HOP_WINDOW)  # seconds a hop added (round trip - serving)
        self.round_trip = LatencyWindow(HOP_WINDOW)  # seconds the forward took in all

    @property
    def forwarded(self) -> int:
        return sum(self.answers.values())


class RoutedModelStats:
    """One model's routing on this node."""

    def __init__(self) -> None:
        self.peers: dict[str, PeerStats] = {}
        self.fallbacks: Counter[str] = Counter()
        self.received: Counter[str] = Counter()  # requests a peer forwarded here, by peer

    def peer(self, name: str) -> PeerStats:
        stats = self.peers.get(name)
        if stats is None:
            stats = self.peers[name] = PeerStats()
        return stats

    def totals(self) -> dict[str, int]:
        """Cumulative ``forwarded`` (answered by a peer), ``errors``, ``fallbacks``,
        ``received``."""
        return {"forwarded": sum(p.forwarded for p in self.peers.values()),
                "errors": sum(p.errors for p in self.peers.values()),
                "fallbacks": sum(self.fallbacks.values()),
                "received": sum(self.received.values())}


class RoutingStats:
    """Every model's routing stats; ``collector`` shows them in ``/metrics``."""

    def __init__(self) -> None:
        self.models: dict[str, RoutedModelStats] = {}

    def model(self, name: str) -> RoutedModelStats:
        stats = self.models.get(name)
        if stats is None:
            stats = self.models[name] = RoutedModelStats()
        return stats

    def answered(self, model: str, peer: str, status: int, round_trip: float,
                 serving: float | None) -> None:
        stats = self.model(model).peer(peer)
        stats.answers[status] += 1
        stats.round_trip.add(round_trip)
        stats.hop.add(max(round_trip - serving, 0.0) if serving is not None else round_trip)

    def failed(self, model: str, peer: str) -> None:
        self.model(model).peer(peer).errors += 1

    def fallback(self, model: str, reason: str) -> None:
        self.model(model).fallbacks[reason] += 1

    def received(self, model: str, peer: str) -> None:
        self.model(model).received[peer] += 1

    def totals(self) -> dict[str, dict[str, int]]:
        return {m: s.totals() for m, s in self.models.items()}

    def forwarded_any(self, model: str) -> bool:
        """Whether a peer ever answered a request for ``model`` forwarded from here."""
        stats = self.models.get(model)
        return stats is not None and any(p.forwarded for p in stats.peers.values())

    def describe(self, model: str) -> dict[str, Any]:
        """One model's routing for ``/v1/cache`` and ``/v1/routing`` (ms)."""
        stats = self.models.get(model)
        if stats is None:
            return {"forwarded": 0, "errors": 0, "fallbacks": 0, "received": 0, "peers": {}}
        peers = {}
        for name, p in sorted(stats.peers.items()):
            hop = p.hop.percentiles((50, 99))
            rt = p.round_trip.percentiles((50, 99))
            peers[name] = {"forwarded": p.forwarded, "errors": p.errors,
                           "answers": {str(k): v for k, v in sorted(p.answers.items())},
                           "hop_ms": {f"p{q}": _ms(v) for q, v in hop.items()},
                           "round_trip_ms": {f"p{q}": _ms(v) for q, v in rt.items()}}
        return {**stats.totals(), "fallback_reasons": dict(sorted(stats.fallbacks.items())),
                "received_from": dict(sorted(stats.received.items())), "peers": peers}

    def collector(self) -> Collector:
        return _Collector(self)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


class _Collector(Collector):
    def __init__(self, stats: RoutingStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator:
        forwarded = CounterMetricFamily(
            "edgeagent_routing_forwarded", "Requests forwarded to a peer, by its answer",
            labels=["model", "peer", "code"])
        errors = CounterMetricFamily(
            "edgeagent_routing_errors", "Forwards that failed (then served here)",
            labels=["model", "peer"])
        fallbacks = CounterMetricFamily(
            "edgeagent_routing_fallbacks",
            "Requests planned on another node but served here, by why", labels=["model", "reason"])
        received = CounterMetricFamily(
            "edgeagent_routing_received", "Requests a peer forwarded here",
            labels=["model", "peer"])
        hop = GaugeMetricFamily(
            "edgeagent_routing_hop_seconds",
            "Latency a hop to the peer added (recent requests' quantile)",
            labels=["model", "peer", "quantile"])
        for model, m in sorted(self.stats.models.items()):
            for peer, p in sorted(m.peers.items()):
                for code, count in sorted(p.answers.items()):
                    forwarded.add_metric([model, peer, str(code)], count)
                errors.add_metric([model, peer], p.errors)
                for q, v in p.hop.percentiles((50, 99)).items():
                    if v is not None:
                        hop.add_metric([model, peer, f"{q / 100:g}"], v)
            for reason, count in sorted(m.fallbacks.items()):
                fallbacks.add_metric([model, reason], count)
            for peer, count in sorted(m.received.items()):
                received.add_metric([model, peer], count)
        yield from (forwarded, errors, fallbacks, received, hop)
