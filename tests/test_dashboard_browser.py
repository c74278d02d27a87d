"""The dashboard pages in a real headless Chromium (Debian's ``chromium``, over the
DevTools protocol): the agent's page lists the models and shows a load done through
the API after its refresh; with tokens the page asks for one (a read token will do); the coordinator's
page lists nodes, the plan and predicted vs measured latency. Screenshots are taken
(``EDGEAGENT_DASHBOARD_PNG=docs/dashboard.png`` also saves the agent's there)."""

from __future__ import annotations

import asyncio
import os
import shutil
import struct

import pytest

from tests.browser import Browser
from tests.helpers import REPORT, TINY_MLP, add_mlp, add_synthetic

BINARY = Browser.find()
pytestmark = pytest.mark.skipif(
    BINARY is None, reason="no chromium binary on PATH (Debian: apt-get install chromium; "
                           ".ci/run installs it where apt is available)")


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", png[16:24])


def page_errors(browser: Browser) -> list[str]:
    """Script errors, exceptions and CSP violations (not HTTP statuses the page handles)."""
    return [e for e in browser.errors if not e.startswith("network:")]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def infer(agent, model, n=1):
    doc = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, TINY_MLP["inputs"]],
                       "data": [0.5] * TINY_MLP["inputs"]}]}
    for _ in range(n):
        assert agent.request("POST", f"/v2/models/{model}/infer", doc)[0] == 200


ROW = "document.querySelector('#models tr[data-model=\"{}\"] td.{}')?.textContent"


def test_agent_page_shows_the_cache_and_a_load_after_its_refresh(repo, start_agent, tmp_path):
    add_mlp(repo, "classifier", config={"slo": {"latency_ms": 50}})
    add_mlp(repo, "ranker", seed=3, config={"pin": True})
    add_mlp(repo, "embedder", seed=4)
    add_synthetic(repo, "detector", size_bytes=40_000_000, load_ms=50,
                  slo={"latency_ms": 20}, base_ms=5)
    agent = start_agent(repo)
    infer(agent, "classifier", 20)
    infer(agent, "ranker", 5)
    synthetic = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2],
                             "data": [1, 2]}]}
    assert agent.request("POST", "/v2/models/detector/infer", synthetic)[0] == 200

    async def scenario():
        async with Browser(BINARY, tmp_path) as browser:
            await browser.open(agent.url + "/?refresh=300")
            names = await browser.wait_for(
                "[...document.querySelectorAll('#models tbody tr[data-model]')]"
                ".map(r => r.dataset.model).join(',')")
            assert names.split(",") == ["classifier", "detector", "embedder", "ranker"]
            assert await browser.evaluate(ROW.format("classifier", "state")) == "ready"
            assert await browser.evaluate(ROW.format("embedder", "state")) == "unloaded"
            assert await browser.evaluate(ROW.format("ranker", "pinned")) == "pinned"
            assert await browser.evaluate(ROW.format("embedder", "loads")) == "0"
            latency = await browser.evaluate(ROW.format("classifier", "latency"))
            assert latency.endswith("ms"), latency
            memory = await browser.evaluate(
                "document.querySelector('#memory [data-device=cpu]').textContent")
            assert "used of 190.7 MiB" in memory and "0 loads waiting" in memory
            disk = await browser.evaluate(
                "document.querySelector('#memory [data-device=disk]').textContent")
            assert "on disk of" in disk and "0 versions" in disk, disk
            # no selection app in this repository: no panel for them
            assert await browser.evaluate(
                "document.getElementById('selection-section').hidden") is True
            updates = int(await browser.evaluate("document.body.dataset.updates"))

            # A load through the API shows up after the page's next refresh(es).
            status, _, _ = agent.request("POST", "/v2/repository/models/embedder/load")
            assert status == 200
            await browser.wait_for(ROW.format("embedder", "state") + " === 'ready'")
            assert await browser.evaluate(ROW.format("embedder", "loads")) == "1"
            assert int(await browser.evaluate("document.body.dataset.updates")) > updates
            tile = await browser.evaluate(
                "document.querySelector('[data-tile=resident] .value').textContent")
            assert tile == "4 / 4"
            # ... and an eviction too.
            assert agent.request("POST", "/v1/cache/classifier/evict")[0] == 200
            await browser.wait_for(ROW.format("classifier", "state") + " === 'unloaded'")
            await browser.wait_for(ROW.format("classifier", "evictions") + " === '1'")

            shot = tmp_path / "agent.png"
            png = await browser.screenshot(shot)
            assert shot.stat().st_size == len(png) > 10_000
            width, height = png_size(png)
            assert width >= 1000 and height >= 400
            assert page_errors(browser) == []
            return shot

    shot = run(scenario())
    target = os.environ.get("EDGEAGENT_DASHBOARD_PNG")
    if target:
        shutil.copyfile(shot, target)


def test_agent_page_draws_the_twins_curve_for_the_last_hour(repo, start_agent, tmp_path):
    for name, size, load in (("a", 10_000_000, 40), ("b", 20_000_000, 60),
                             ("c", 15_000_000, 50)):
        add_synthetic(repo, name, size_bytes=size, load_ms=load, base_ms=5)
    agent = start_agent(repo, budget=36_000_000)
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    for i in range(20):
        assert agent.request("POST", f"/v2/models/{'abcab'[i % 5]}/infer", body)[0] == 200
    status, _, curve = agent.request("GET", "/v1/whatif")
    assert status == 200 and curve["requests"] == 20 and curve["budget_bytes"] == 36_000_000
    capacities = [p["capacity_bytes"] for p in curve["points"]]
    # 0.25 x and 0.5 x the budget cannot hold b (20 MB): 1, 2 and 4 x remain
    assert capacities == [36_000_000, 72_000_000, 144_000_000]
    loads = [p["loads"] for p in curve["points"]]
    assert loads[0] > loads[1] == loads[2] == 3  # at 2 x all three stay resident

    async def scenario():
        async with Browser(BINARY, tmp_path) as browser:
            await browser.open(agent.url + "/?refresh=300")
            await browser.wait_for(
                "document.querySelectorAll('#whatif circle').length === 9")
            drawn = await browser.evaluate(
                "[...document.querySelectorAll('#whatif circle[data-series="
                "mean_response_seconds]')].map(c => Number(c.dataset.capacity)).join(',')")
            assert [int(c) for c in drawn.split(",")] == capacities
            means = await browser.evaluate(
                "[...document.querySelectorAll('#whatif circle[data-series="
                "mean_response_seconds]')].map(c => c.dataset.value).join(',')")
            assert [float(v) for v in means.split(",")] == pytest.approx(
                [p["mean_response_seconds"] for p in curve["points"]])
            note = await browser.evaluate("document.getElementById('whatif-note').textContent")
            assert "20 requests of the last hour" in note and "cremebrulee" in note
            budget = await browser.evaluate(
                "document.querySelector('#whatif line.budget').getAttribute('x1')")
            first = await browser.evaluate(
                "document.querySelector('#whatif circle').getAttribute('cx')")
            assert float(budget) == pytest.approx(float(first))  # 1 x: the leftmost point
            # both axes titled; round ticks from 0 up past the highest point
            titles = await browser.evaluate(
                "[...document.querySelectorAll('#whatif .axis-title')].map(t => t.textContent)")
            assert titles[0].startswith("cache capacity") and titles[1] == "time per request"
            ticks = await browser.evaluate(
                "[...document.querySelectorAll('#whatif .tick.y')].map(t => t.textContent)")
            assert len(ticks) >= 4 and ticks[0] == "0", ticks
            highest = max(max(p[k] for k in ("mean_response_seconds", "p99_response_seconds",
                                             "mean_load_delay_seconds"))
                          for p in curve["points"])
            top = ticks[-1]
            top_s = float(top.split()[0]) / (1000 if top.endswith(" ms") else 1)
            assert top_s >= highest and top_s < 2 * highest, (ticks, highest)
            assert await browser.evaluate(
                "[...document.querySelectorAll('#whatif .tick.x')].map(t => t.textContent)") \
                == ["34.3 MiB", "68.7 MiB", "137.3 MiB"]
            # the legend: each line's sample in its colour and dash, then its label
            legend = await browser.evaluate(
                "[...document.querySelectorAll('#whatif .legend line')].map(l => "
                "[l.getAttribute('stroke'), l.getAttribute('stroke-dasharray'), "
                "l.nextElementSibling.textContent])")
            paths = await browser.evaluate(
                "[...document.querySelectorAll('#whatif path[data-series]')].map(p => "
                "[p.getAttribute('stroke'), p.getAttribute('stroke-dasharray')])")
            assert [entry[:2] for entry in legend[:3]] == paths and len(paths) == 3
            assert [entry[2] for entry in legend] == [
                "mean response", "p99 response", "load delay per request",
                "this node's budget"]
            assert legend[1][1] not in ("none", None)  # p99 dashed, told from the mean
            budget_line = await browser.evaluate(
                "document.querySelector('#whatif line.budget').getAttribute('stroke-dasharray')")
            assert legend[3][1] == budget_line
            png = await browser.screenshot(tmp_path / "whatif.png")
            assert png_size(png)[0] >= 1000
            assert page_errors(browser) == []

    run(scenario())


READ_TOKEN = "read-token-0123456789abcdef0123456789abcdef"


def test_agent_page_shows_selection_apps_with_a_read_token(repo, start_agent, tmp_path):
    """The app's members with their weights, selections and answers, its mean confidence
    and the histogram, as /v1/selection gives them; a read token is enough."""
    import numpy as np
    import yaml

    from agent.security.authconfig import AgentAuthSettings
    from agent.security.credentials import token_hash
    from tests.helpers import add_app, add_classifier

    add_classifier(repo, "good", classes=10, seed=1, error=0.05)
    add_classifier(repo, "poor", classes=10, seed=2, error=0.7)
    add_app(repo, "vote", ["good", "poor"])
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump([{"name": "dash", "scopes": ["read"],
                                       "sha256": token_hash(READ_TOKEN)}]))
    # inference and feedback left open (protect=()): this test is about the page
    agent = start_agent(repo, auth=AgentAuthSettings(token_file=tokens, protect=()))
    read = {"Authorization": f"Bearer {READ_TOKEN}"}
    truth = np.random.default_rng(3).integers(0, 10, 60)
    for q, label in enumerate(truth):
        x = [float(q), float(label), 0.0]
        status, _, doc = agent.request("POST", "/v2/models/vote/infer", {
            "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 3], "data": x}]})
        assert status == 200, doc
        assert agent.request("POST", "/v2/models/vote/feedback",
                             {"id": doc["id"], "labels": [int(label)]})[0] == 200
    status, _, (app,) = agent.request("GET", "/v1/selection", headers=read)
    assert status == 200 and app["requests"] == 60
    assert 0 < app["confidence_mean"] <= 1
    # the list is the read scope's; an app's contexts and any change stay the admin's
    assert agent.request("GET", "/v1/selection/vote", headers=read)[0] == 403
    assert agent.request("POST", "/v1/selection/vote/reset", headers=read)[0] == 403
    weights = {m["member"]: m["weight"] for m in app["members"]}
    assert weights["good:1"] > 0.8 > 0.2 > weights["poor:1"], weights

    async def scenario():
        async with Browser(BINARY, tmp_path) as browser:
            await browser.open(agent.url + "/?refresh=300")
            await browser.wait_for("!document.getElementById('token-form').hidden")
            await browser.evaluate(
                "(() => { const f = document.getElementById('token-form');"
                f" f.elements.token.value = '{READ_TOKEN}'; f.requestSubmit(); }})()")
            await browser.wait_for("!!document.querySelector('#selection [data-app=vote]')")
            assert await browser.evaluate(
                "document.getElementById('selection-section').hidden") is False
            rows = await browser.evaluate(
                "[...document.querySelectorAll('#selection [data-app=vote] tr[data-member]')]"
                ".map(r => [r.dataset.member, r.querySelector('.weight').textContent, "
                "r.querySelector('.answered').textContent])")
            assert rows == [[m["member"], f"{100 * m['weight']:.1f} %", str(m["answered"])]
                            for m in app["members"]]
            header = await browser.evaluate(
                "document.querySelector('#selection [data-app=vote] h3').textContent")
            assert "exp4" in header and "60 requests" in header and "60 with feedback" in header
            mean = await browser.evaluate(
                "document.querySelector('#selection .confidence-mean .value').textContent")
            assert mean == f"{app['confidence_mean']:.2f}"
            buckets = await browser.evaluate(
                "[...document.querySelectorAll('#selection .bucket')].map(b => "
                "[b.dataset.bucket, Number(b.querySelector('.count').textContent)])")
            assert buckets == [[k, v] for k, v in app["confidence_histogram"].items()]
            assert sum(v for _, v in buckets) == 60
            png = await browser.screenshot(tmp_path / "selection.png")
            assert png_size(png)[0] >= 1000
            assert page_errors(browser) == []

    run(scenario())


def test_agent_page_asks_for_a_token_and_works_with_a_read_token(repo, start_agent,
                                                                 tmp_path):
    import yaml

    from agent.security.authconfig import AgentAuthSettings
    from agent.security.credentials import token_hash

    add_mlp(repo, "classifier")
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump([{"name": "dash", "scopes": ["read"],
                                       "sha256": token_hash(READ_TOKEN)}]))
    agent = start_agent(repo, auth=AgentAuthSettings(token_file=tokens))
    assert agent.request("GET", "/")[0] == 200  # the page itself needs no token
    assert agent.request("GET", "/v1/cache")[0] == 401

    async def scenario():
        async with Browser(BINARY, tmp_path) as browser:
            await browser.open(agent.url + "/?refresh=300")
            await browser.wait_for("!document.getElementById('token-form').hidden")
            assert await browser.evaluate(
                "document.querySelectorAll('#models tbody tr[data-model]').length") == 0
            await browser.evaluate(  # as a user would: type it, press the button
                "(() => { const f = document.getElementById('token-form');"
                " f.elements.token.value = 'wrong'; f.requestSubmit(); })()")
            await asyncio.sleep(0.5)
            await browser.wait_for("!document.getElementById('token-form').hidden")
            await browser.evaluate(
                "(() => { const f = document.getElementById('token-form');"
                f" f.elements.token.value = '{READ_TOKEN}'; f.requestSubmit(); }})()")
            await browser.wait_for(ROW.format("classifier", "state") + " === 'unloaded'")
            assert await browser.evaluate("document.getElementById('token-form').hidden")
            assert page_errors(browser) == []

    run(scenario())


def test_coordinator_page_lists_nodes_plan_and_latencies(start_coordinator, tmp_path):
    co = start_coordinator()
    assert co.request("PUT", "/v1/models/a", {"slo_ms": 100})[0] == 201
    assert co.request("PUT", "/v1/models/b", {"slo_ms": 250, "percentile": 95})[0] == 201

    async def scenario():
        async with Browser(BINARY, tmp_path) as browser:
            await browser.open(co.url + "/?refresh=300")
            await browser.wait_for("!!document.querySelector('#no-plan')")
            assert await browser.evaluate(
                "document.querySelector('#nodes tbody').textContent.trim()") \
                == "no node has reported yet"
            assert co.request("POST", "/v1/nodes/n1/report", REPORT)[0] == 200
            assert co.request("POST", "/v1/nodes/n2/report", {
                "capacity": {"cores": 2, "cpu_memory_bytes": 500_000_000},
                "models": {"b": {"resident": True, "latency_ms": {"p95": 80, "p99": 120}}},
                "peer": {"url": "http://127.0.0.1:18002"},  # a node that routes
                "routing": {"models": {"b": {"served": 30, "forwarded": 12,
                                             "fallbacks": 1}}}})[0] == 200
            status, plan = co.request("POST", "/v1/plan")
            assert status == 200
            await browser.wait_for(
                "document.querySelectorAll('#nodes tbody tr[data-node]').length === 2")
            resident = await browser.evaluate(
                "document.querySelector('#nodes tr[data-node=n1] td.resident').textContent")
            assert resident == "a"
            await browser.wait_for(
                "document.querySelector('[data-tile=plan] .value')?.textContent === "
                f"'#{plan['id']}'")
            row = "document.querySelector('#models tr[data-model={}] td.{}').textContent"
            a = plan["models"]["a"]
            assert await browser.evaluate(row.format("a", "replicas")) == str(a["replicas"])
            assert await browser.evaluate(row.format("a", "measured")) == "40.0 ms"  # p99
            assert await browser.evaluate(row.format("b", "measured")) == "80.0 ms"  # p95
            predicted = await browser.evaluate(row.format("a", "predicted"))
            assert predicted != "–" and predicted.endswith(("ms", " s")), predicted
            assert "n1×" in await browser.evaluate(row.format("a", "placement"))
            assert await browser.evaluate(row.format("b", "routed")) == \
                "n2 30 (→12) (1 fallback)"  # which node served how much of b
            assert await browser.evaluate(
                "document.querySelector('#nodes-shown').textContent") == "2"
            # a fleet larger than a page: the first 100 nodes by name, and the count
            for i in range(120):
                assert co.request("POST", f"/v1/nodes/z-{i:03d}/report", REPORT)[0] == 200
            status, plan = co.request("POST", "/v1/plan")
            assert status == 200
            await browser.wait_for(
                "document.querySelector('#nodes-shown').textContent === "
                "'the first 100 of 122 by name'")
            shown = await browser.evaluate(
                "[...document.querySelectorAll('#nodes tbody tr[data-node]')]"
                ".map((tr) => tr.dataset.node)")
            assert shown == ["n1", "n2"] + [f"z-{i:03d}" for i in range(98)]
            await browser.wait_for(
                "document.querySelector('[data-tile=plan] .value')?.textContent === "
                f"'#{plan['id']}'")
            placement = await browser.evaluate(row.format("a", "placement"))
            on = len(plan["models"]["a"]["placement"])
            assert placement.endswith(f"… {on - 8} more node{'s' if on > 9 else ''}") if on > 8 \
                else placement.count("×") == on, (on, placement)
            png = await browser.screenshot(tmp_path / "coordinator.png")
            assert (tmp_path / "coordinator.png").stat().st_size > 10_000
            assert png_size(png)[0] >= 1000
            assert page_errors(browser) == []

    run(scenario())


def test_a_slow_server_is_refreshed_less_often(start_coordinator, tmp_path):
    """The page waits ten times as long as its last refresh took where that is longer
    than ?refresh= (at 10,000 nodes a refresh costs the coordinator ~0.1-0.4 s). The
    server is made slow by delaying the page's own fetch by 400 ms: from then on a
    refresh takes >= 0.4 s, so the next one starts >= 4 s after it ends (at the fixed
    250 ms pace, ~0.65 s). Both bounds: the page goes on refreshing (two refreshes end
    within 30 s), and not sooner than that (>= 4 s apart; a loaded box only lengthens
    the gap)."""
    co = start_coordinator()

    async def scenario():
        async with Browser(BINARY, tmp_path) as browser:
            await browser.open(co.url + "/?refresh=250")
            await browser.wait_for("Number(document.body.dataset.updates || 0) >= 2")
            await browser.evaluate(  # when each refresh ends, from now on
                "window.ended = []; new MutationObserver(() => window.ended.push("
                "performance.now() / 1000)).observe(document.body, "
                "{attributes: true, attributeFilter: ['data-updates']}); 1")
            await browser.evaluate(
                "window.fetch = ((real) => (...args) => new Promise("
                "(resolve) => setTimeout(resolve, 400)).then(() => real(...args)))"
                "(window.fetch); 1")
            # the first refresh to end may have started before the delay; the second
            # started after it, so it was slow; the third follows the slow one
            ended = await browser.wait_for("window.ended.length >= 3 && window.ended",
                                           timeout=30)
            assert ended[2] - ended[1] >= 4.0, ended
            assert page_errors(browser) == []

    run(scenario())


def test_coordinator_page_shows_the_rollouts(start_coordinator, tmp_path):
    """A rollout under way, then rolled back: its row shows the versions, the wave and
    its phase, the window's figures and the reason."""
    from agent.coordinator.catalog import ModelSLO
    from agent.coordinator.rollout import ROLLED_BACK, RolloutSettings, new_rollout

    co = start_coordinator(rollout_check_s=3600)  # the test moves the rollout itself
    store = co.co.store
    store.put_model(ModelSLO("m", slo_ms=100, source=f"file://{tmp_path}", version=1), 0.0)
    rollout = store.start_rollout(
        lambda i: new_rollout(i, "m", (1, None), (2, None), RolloutSettings(), ["a", "b"],
                              {}, 99.0, 1.0),
        ModelSLO("m", slo_ms=100, source=f"file://{tmp_path}", version=2), 1.0)
    cell = "document.querySelector('#rollouts tr[data-rollout=\"{}\"] td.{}')?.textContent"

    async def scenario():
        async with Browser(BINARY, tmp_path) as browser:
            await browser.open(co.url + "/?refresh=300")
            await browser.wait_for(cell.format(rollout.id, "wave") + " === '1/2 switching'")
            ended = rollout.aborted(2.0, "x")
            from dataclasses import replace

            ended = replace(ended, state=ROLLED_BACK, reason="latency: p99 3.10x",
                            figures={"new": {"requests": 40, "error_rate": 0.0,
                                             "latency_ms": 31.0},
                                     "old": {"requests": 90, "error_rate": 0.0,
                                             "latency_ms": 10.0}})
            assert store.save_rollout(ended, was=rollout.updated)
            await browser.wait_for(cell.format(rollout.id, "reason")
                                   + " === 'latency: p99 3.10x'")
            assert await browser.evaluate(cell.format(rollout.id, "wave")) == "1/2"
            row = await browser.evaluate(
                f"document.querySelector('#rollouts tr[data-rollout=\"{rollout.id}\"]')"
                ".textContent")
            assert "1 → 2" in row and "rolled_back" in row and "31.0 ms" in row, row
            assert page_errors(browser) == []

    run(scenario())


def test_agent_page_shows_what_it_routed(repo, tmp_path):
    """Two agents that route (a table given as a coordinator's answer gives it): the
    page of the one a request landed on shows its model, the peer, the forward."""
    from agent.config import AgentConfig, CoordinatorLink
    from agent.wire import Directives, RoutingTable
    from tests.helpers import AgentServer

    add_mlp(repo, "classifier")
    agents = {}
    try:
        for name in ("edge-a", "edge-b"):
            link = CoordinatorLink(url="http://127.0.0.1:9", node_name=name,
                                   report_interval_s=3600)  # tables given below
            agents[name] = AgentServer(AgentConfig(
                repository=repo, data_dir=tmp_path / name, cpu_budget=100_000_000,
                infer_threads=2, coordinator=link), budgets={"cpu": 100_000_000})
        table = RoutingTable(version=1, max_age_s=600, models={"classifier": {"edge-b": 1}},
                             nodes={n: a.node.router.address for n, a in agents.items()})

        async def take(router):
            router.take(Directives(ttl_s=60, routing_version=1, routing=table))
        agents["edge-a"].call(take(agents["edge-a"].node.router))
        infer(agents["edge-a"], "classifier", 3)

        async def scenario():
            async with Browser(BINARY, tmp_path) as browser:
                await browser.open(agents["edge-a"].url + "/?refresh=300")
                row = "document.querySelector('#routing tr[data-peer=\"edge-b\"]')"
                cells = await browser.wait_for(
                    f"{row} && [...{row}.children].map(c => c.textContent).join('|')")
                assert cells.split("|")[:5] == ["classifier", "edge-b×1", "edge-b", "3",
                                                "0"], cells
                note = await browser.evaluate(
                    "document.getElementById('routing-note').textContent")
                assert note.startswith("node edge-a; table 1") and "edge-b up" in note
                assert page_errors(browser) == []
        run(scenario())
    finally:
        for agent in agents.values():
            agent.close()
