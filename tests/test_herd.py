"""A herd the coordinator absorbs: nodes back off with full jitter and obey Retry-After
(``agent.backoff``), a coordinator or report worker refuses reports early while its
event loop runs late (``agent.coordinator.shedding``), its cost is counted
(``agent.coordinator.cost``), and an agent keeps serving on its last directives while
it is refused, saying how old they are."""

from __future__ import annotations

import asyncio
import email.utils
import random
import re
import threading
import time
import urllib.request

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from agent.backoff import MAX_RETRY_AFTER_S, backoff_cap, parse_retry_after, retry_delay
from agent.coordinator.cost import CostMeter
from agent.cli import main
from agent.coordinator.shedding import PROBE_S, Overloaded, Shedder
from agent.errors import http_status
from tests.helpers import BODY, REPORT, add_synthetic, request, wait_for


# -- backoff ---------------------------------------------------------------------------


def test_full_jitter_spreads_a_herd_over_the_whole_bound():
    rng = random.Random(7)
    for failures, bound in ((1, 10.0), (2, 20.0), (3, 30.0), (9, 30.0)):
        waits = [retry_delay(failures, 5.0, 30.0, rng=rng.random) for _ in range(4000)]
        assert 0.0 <= min(waits) < 0.05 * bound and 0.95 * bound < max(waits) <= bound
        # uniform: a quarter of the herd in each quarter of the bound, not one second
        quarters = [sum(q * bound / 4 <= w < (q + 1) * bound / 4 for w in waits)
                    for q in range(4)]
        assert all(800 < n < 1200 for n in quarters), quarters
    assert retry_delay(0, 5.0, 30.0, rng=lambda: 1.0) == 5.0
    assert retry_delay(10_000, 5.0, 30.0, rng=lambda: 1.0) == 30.0  # no overflow


def test_retry_after_is_obeyed_and_spread_over_r_to_2r():
    rng = random.Random(3)
    waits = [retry_delay(1, 5.0, 30.0, 4.0, rng=rng.random) for _ in range(2000)]
    assert 4.0 <= min(waits) < 4.1 and 7.9 < max(waits) <= 8.0
    # a refusal does not escalate: the tenth in a row waits as the server said
    assert 4.0 <= retry_delay(10, 5.0, 30.0, 4.0, rng=rng.random) <= 8.0
    # beyond the bound of the reporter's own jitter, too
    assert retry_delay(1, 5.0, 30.0, 100.0, rng=lambda: 0.0) == 100.0
    assert retry_delay(1, 5.0, 30.0, 1e9, rng=lambda: 0.0) == MAX_RETRY_AFTER_S


def test_backoff_cap_is_eight_intervals_up_to_thirty_seconds():
    assert backoff_cap(0.1) == pytest.approx(0.8)
    assert backoff_cap(2.0) == 16.0
    assert backoff_cap(5.0) == 30.0
    assert backoff_cap(60.0) == 60.0  # never under one interval


def test_parse_retry_after_takes_seconds_or_a_date():
    now = 1_800_000_000.0
    assert parse_retry_after("5", now) == 5.0
    assert parse_retry_after(" 12 ", now) == 12.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now) == pytest.approx(30.0)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now) == 0.0
    for bad in (None, "", "-1", "1.5", "soon", "٣", "Mon, 99 Foo 2026 00:00:00 GMT"):
        assert parse_retry_after(bad, now) is None, bad


# -- shedding --------------------------------------------------------------------------


def test_a_short_stall_barely_counts_a_sustained_lag_refuses():
    shed = Shedder(0.25, 1000, 5.0)
    shed.observe(0.0, 0.05, 0.05)
    shed.observe(0.3, 0.35, 0.35)  # one collection of 300 ms
    assert shed.lag < 0.25
    shed.check(0)  # admitted
    for _ in range(6):  # then the loop runs 400 ms late for two seconds, always busy
        shed.observe(0.4, 0.45, 0.45)
    assert shed.lag > 0.25 and shed.saturated
    with pytest.raises(Overloaded) as refused:
        shed.check(0)
    assert http_status(refused.value) == 503 and refused.value.retry_after == 5.0
    assert "ms late" in str(refused.value) and shed.refused == 1
    for _ in range(20):  # refusing is cheap: the loop catches up, reports come in again
        shed.observe(0.0, PROBE_S, PROBE_S / 2)
    shed.check(0)
    assert shed.refused == 1


def test_a_loop_late_on_a_busy_machine_that_still_idles_is_not_refusing():
    """Late because the machine gives it little CPU, but with time to spare between
    reports: it keeps up with them, and refusing would only add the retries' cost."""
    shed = Shedder(0.25, 1000, 5.0)
    for _ in range(20):
        shed.observe(0.4, 0.45, 0.25)  # had work 55 % of the time
    assert shed.lag > 0.25 and not shed.saturated
    shed.check(0)
    for _ in range(20):  # unknown (no schedstat): the lag alone decides
        shed.observe(0.4, 0.45)
    with pytest.raises(Overloaded):
        shed.check(0)


def test_a_queue_past_its_limit_refuses():
    shed = Shedder(0.25, 100, 2.0)
    shed.check(100)
    with pytest.raises(Overloaded, match="101 answered reports wait"):
        shed.check(101)


def spin(seconds: float) -> None:
    """Keep this thread on a CPU for ``seconds`` (as reports to answer would)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_the_probe_measures_a_real_loop_late_and_busy_or_only_late():
    async def main():
        shed = Shedder(0.1, 1000, 1.0)
        probe = asyncio.get_running_loop().create_task(shed.watch())
        await asyncio.sleep(0.3)
        quiet = (shed.lag, shed.busy)
        for _ in range(8):  # the loop busy 0.4 s out of every 0.42 s
            spin(0.4)
            await asyncio.sleep(0.02)
        busy = (shed.lag, shed.busy, shed.saturated)
        for _ in range(8):  # then late as much, but waiting, not working
            time.sleep(0.3)
            await asyncio.sleep(0.05)
        waiting = (shed.lag, shed.busy, shed.saturated)
        probe.cancel()
        return quiet, busy, waiting

    quiet, busy, waiting = asyncio.run(main())
    assert quiet[0] < 0.02 and quiet[1] < 0.5, quiet
    assert busy[0] > 0.1 and busy[1] > 0.9 and busy[2], busy
    assert waiting[0] > 0.1 and waiting[1] < 0.5 and not waiting[2], waiting


# -- cost ------------------------------------------------------------------------------


def test_cost_meter_ratios_over_its_window_and_dead_workers_stay_counted():
    meter = CostMeter()
    assert meter.per_report() is None and meter.per_node_second() is None
    meter.cpu("main", 1, 10.0)
    meter.cpu("report_workers", 2, 5.0)
    meter.tally(1, 0, 0)
    meter.tally(2, 1000, 0)
    meter.sample(100.0, live_nodes=500)
    meter.cpu("main", 1, 11.0)
    meter.cpu("report_workers", 2, 6.0)  # worker 2 died after this ...
    meter.cpu("report_workers", 3, 1.0)  # ... and worker 3 took over
    meter.cpu("planner", 4, 2.0)
    meter.tally(2, 3000, 10)
    meter.tally(3, 1000, 5)
    meter.sample(110.0, live_nodes=500)
    assert meter.cpu_total("report_workers") == 7.0
    # (1 + 1 + 1) s of report-path CPU over 3,000 reports; (3 + 2) s over 5,000 node-s
    assert meter.per_report() == pytest.approx(0.001)
    assert meter.per_node_second() == pytest.approx(5.0 / 5000)
    assert meter.reports() == (4000, 15)
    text = "\n".join(meter.metrics_lines("x", {"coordinator": (0.002, 0.25)}))
    assert 'x_cpu_seconds_total{part="report_workers"} 7.000000' in text
    assert 'x_reports_total{answer="refused"} 15' in text
    assert "x_cpu_per_report_seconds 0.001000000" in text
    assert "x_live_nodes 500" in text and 'x_loop_lag_seconds{process="coordinator"}' in text
    assert 'x_loop_busy_ratio{process="coordinator"} 0.2500' in text
    for t in range(11, 30):  # a minute later the window holds only the last minute
        meter.sample(100.0 + 10 * t, live_nodes=500)
    assert meter.per_report() is None  # no report in it


# -- a coordinator whose loop runs late ---------------------------------------------------


def block_loop(server, until: threading.Event, busy_s: float = 0.4, free_s: float = 0.01):
    """Keep ``server``'s event loop working ``busy_s`` out of every ``busy_s + free_s``
    (as more reports than it can answer would) until ``until`` is set."""
    def work() -> None:
        if not until.is_set():
            spin(busy_s)
            server.loop.call_later(free_s, work)

    server.loop.call_soon_threadsafe(work)


def test_an_overloaded_coordinator_refuses_with_retry_after_and_counts_it(start_coordinator):
    co = start_coordinator(report_retry_after_s=3, report_shed_lag_ms=200)
    assert co.request("POST", "/v1/nodes/a/report", REPORT)[0] == 200
    stop = threading.Event()
    block_loop(co, stop)
    try:
        def refused():
            status, answer, headers = request(f"{co.url}/v1/nodes/a/report", "POST", REPORT,
                                              timeout=10)
            return status == 503 and (answer, headers)
        answer, headers = wait_for(refused, 15, "a report refused while the loop runs late")
        assert headers["Retry-After"] == "3" and "busy" in answer["error"]
    finally:
        stop.set()
    # once the loop keeps up again, reports are answered; the refusals were counted
    wait_for(lambda: co.request("POST", "/v1/nodes/a/report", REPORT)[0] == 200, 10)
    with urllib.request.urlopen(f"{co.url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for f in families.values() for s in f.samples}
    prefix = "edgeagent_coordinator_"
    assert value[(prefix + "reports_total", (("answer", "refused"),))] >= 1
    assert value[(prefix + "reports_total", (("answer", "answered"),))] >= 2
    assert value[(prefix + "cpu_seconds_total", (("part", "main"),))] > 0
    assert value[(prefix + "live_nodes", ())] == 1, text
    assert families[prefix + "loop_lag_seconds"].type == "gauge"
    assert families[prefix + "cpu_seconds"].type == "counter"


def test_a_refused_agent_serves_on_its_last_directives_and_obeys_retry_after(
        tmp_path, repo, start_coordinator):
    from agent.config import AgentConfig, CoordinatorLink
    from tests.helpers import AgentServer

    add_synthetic(repo, "m")
    co = start_coordinator(report_retry_after_s=1, report_shed_lag_ms=200, directive_ttl_s=30)
    cfg = AgentConfig(repository=repo, data_dir=tmp_path / "data", cpu_budget=50_000_000,
                      infer_threads=2, coordinator=CoordinatorLink(
                          url=co.url, node_name="n1", report_interval_s=0.1))
    agent = AgentServer(cfg, budgets={"cpu": 50_000_000})
    stop = threading.Event()
    try:
        status = wait_for(lambda: (lambda s: s["reports"] >= 2 and s)(
            agent.request("GET", "/v1/coordinator")[2]))
        assert status["directives"] is not None and status["directives_age_s"] < 1
        refused_before = co.co.shedder.refused
        block_loop(co, stop)
        status = wait_for(lambda: (lambda s: s["failures"] and s)(
            agent.request("GET", "/v1/coordinator")[2]), 15, "a refused report")
        assert "503" in status["last_error"] and status["retry_after_s"] == 1.0
        assert 0 < status["next_report_in_s"] <= 2.0
        time.sleep(3)
        status = agent.request("GET", "/v1/coordinator")[2]
        # still on the directives of its last report, which it says are old ...
        assert status["directives"] is not None and status["directives_age_s"] >= 3
        assert status["directives_expire_in_s"] > 0
        assert agent.request("POST", "/v2/models/m/infer", BODY)[0] == 200  # ... serving
        shown = CliRunner().invoke(main, ["cache", "ls", "--url", agent.url])
        line = shown.output.splitlines()[-1]
        assert shown.exit_code == 0 and line.startswith(f"coordinator {co.url}: "), shown.output
        assert "failed in a row (CoordinatorRefused: coordinator answered 503: the coordinator is busy" \
            in line
        assert re.search(r"directives (\d+\.\d) s old \(no plan\), lapse in", line), line
        assert float(re.search(r"directives (\S+) s old", line)[1]) >= 3
        # every 0.1 s it would have tried 30 times; Retry-After (1 s) spaced them out
        assert co.co.shedder.refused - refused_before <= 4
        stop.set()
        status = wait_for(lambda: (lambda s: s["failures"] == 0 and s)(
            agent.request("GET", "/v1/coordinator")[2]), 15, "reports answered again")
        assert status["retry_after_s"] is None and status["directives_age_s"] < 1
    finally:
        stop.set()
        agent.close()


# -- a coordinator restarted under a herd (real processes) ---------------------------------


class Herd:
    """``count`` simulated nodes in a thread of their own, each on its own kept
    connection, reporting every ``interval`` s and backing off as the agent's reporter
    does (``agent.backoff``); every answer noted: (monotonic time, status or None for a
    failed connection, whether it carried Retry-After)."""

    def __init__(self, port: int, count: int, interval: float) -> None:
        self.port, self.count, self.interval = port, count, interval
        self.answers: dict[str, list[tuple[float, int | None, bool]]] = {
            f"herd-{i}": [] for i in range(count)}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.thread.start()

    async def _main(self) -> None:
        await asyncio.gather(*(self._node(name, i) for i, name in enumerate(self.answers)))

    async def _node(self, name: str, i: int) -> None:
        import aiohttp

        rng = random.Random(i)
        url = f"http://127.0.0.1:{self.port}/v1/nodes/{name}/report"
        failures = 0
        await asyncio.sleep(rng.uniform(0, self.interval))
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1),
                timeout=aiohttp.ClientTimeout(total=10)) as session:
            while not self.stop.is_set():
                retry_after = None
                try:
                    async with session.post(url, json=REPORT) as resp:
                        await resp.read()
                        status = resp.status
                        retry_after = parse_retry_after(resp.headers.get("Retry-After"),
                                                        time.time())
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                    status = None
                self.answers[name].append((time.monotonic(), status, retry_after is not None))
                failures = 0 if status == 200 else failures + 1
                await asyncio.sleep(self.interval if status == 200 else retry_delay(
                    failures, self.interval, backoff_cap(self.interval), retry_after,
                    rng=rng.random))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.mark.slow
def test_a_coordinator_restarted_under_a_herd(tmp_path, repo):
    """Two agent processes and 300 simulated nodes report to a coordinator with two
    report workers; it is stopped for longer than the directives' ttl and started again
    on the same port and store. Every node is back within seconds of its return, no
    answer is a 5xx other than 429/503 with Retry-After, and no agent acts on
    directives older than their ttl (it reverts them while the coordinator is away)."""
    import yaml

    from tests.helpers import Agent, CoordinatorProcess

    ttl = 4.0
    settings = {"report_workers": 2, "directive_ttl_s": ttl,
                "report_retry_after_s": 1, "reactive_interval_s": 3600}
    co = CoordinatorProcess(None, tmp_path / "co", **settings)
    port = co.port
    assert request(f"{co.url}/v1/models/m", "PUT", {"slo_ms": 200})[0] == 201
    add_synthetic(repo, "m")
    agents = []
    for i in range(2):
        config = tmp_path / f"agent-{i}.yaml"
        config.write_text(yaml.safe_dump({"coordinator": {
            "url": co.url, "node_name": f"agent-{i}", "report_interval_s": 0.5}}))
        agents.append(Agent(repo, tmp_path / f"data-{i}", "--config", str(config)))
    herd = Herd(port, 300, 1.0)
    seen: dict[str, list[tuple[float, dict]]] = {a: [] for a in ("agent-0", "agent-1")}
    watching = threading.Event()

    def watch() -> None:  # each agent's own view of its directives, every 0.1 s
        while not watching.is_set():
            for name, agent in zip(seen, agents):
                status = agent.get("/v1/coordinator")
                if status is not None:
                    seen[name].append((time.monotonic(), status))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        wait_for(lambda: len(co.nodes()) == 302, 30, "every node reported")
        status, plan, _ = co.post("/v1/plan")
        assert status == 200

        def planned() -> bool:  # both agents follow the plan; it pins m on one or both
            states = [a.get("/v1/coordinator") for a in agents]
            return all((s["directives"] or {}).get("plan_id") == plan["id"] for s in states) \
                and {m for s in states for m in s["pinned_by_coordinator"]} == {"m"}

        wait_for(planned, 20, "the plan's directives on both agents")
        watcher.start()
        time.sleep(1)
        co.stop()
        gone = time.monotonic()
        time.sleep(ttl + 2)  # away for longer than the directives live
        restarting = time.monotonic()
        co = CoordinatorProcess(None, tmp_path / "co", port=port, **settings)
        up = time.monotonic()
        try:
            wait_for(lambda: all(any(t > up and s == 200 for t, s, _ in answers)
                                 for answers in herd.answers.values()), 30,
                     "every simulated node answered 200 by the new coordinator")
        except AssertionError:
            after = [s for node in herd.answers.values() for t, s, _ in node if t > up]
            back = sum(any(t > up and s == 200 for t, s, _ in node)
                       for node in herd.answers.values())
            raise AssertionError(f"{back} of {herd.count} back; answers since: "
                                 f"{ {s: after.count(s) for s in set(after)} }; "
                                 f"{co.log_path.read_text()[-3000:]}") from None
        wait_for(lambda: all(seen[n] and seen[n][-1][0] > up and seen[n][-1][1]["reports"]
                             and seen[n][-1][1]["failures"] == 0 for n in seen), 30,
                 "both agents report again")
        back = max(min(t for t, s, _ in answers if t > up and s == 200)
                   for answers in herd.answers.values())
        wait_for(planned, 20, "the plan's directives again (the store kept the plan)")
    finally:
        watching.set()
        herd.close()
        for agent in agents:
            agent.stop()
        co.stop()
    # back within seconds of the coordinator's return (full jitter: at most 8 intervals)
    assert back - up < 8 * herd.interval + 5, back - up
    # no 5xx but a refusal carrying Retry-After
    answers = [a for node in herd.answers.values() for a in node]
    bad = [(s, ra) for _, s, ra in answers if s is not None and s != 200
           and not (s in (429, 503) and ra)]
    assert bad == [], bad[:5]
    assert any(s is None for _, s, _ in answers)  # connections failed while it was away
    # no agent acted on directives older than their ttl: it reverted them, then took new
    for name, statuses in seen.items():
        ages = [s["directives_age_s"] for _, s in statuses if s["directives"] is not None]
        assert ages and max(ages) <= ttl + 0.5, (name, max(ages))
        away = [s for t, s in statuses if gone + ttl + 0.5 < t < restarting]
        assert away and all(s["directives"] is None and s["pinned_by_coordinator"] == []
                            for s in away), name
