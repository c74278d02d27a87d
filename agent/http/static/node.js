// The agent's dashboard: GET /v2 (name, version), /v1/memory (budgets), /v1/disk (the
// disk tier of pulled models), /v1/cache (models), /v1/whatif (the twin's curve),
// /v1/selection (the selection apps; these need a read token where the agent has
// tokens), refreshed every ?refresh= ms. PANELS below: what each part of the page draws.
"use strict";

(() => {
  const { api, el, bytes, ms, pct, bar, replaceRows, poll } = Dash;

  function memoryRows(memory) {
    return Object.entries(memory).map(([device, m]) => {
      const free = m.budget_bytes - m.used_bytes;
      return el("div", { class: "device", "data-device": device },
        el("strong", {}, device),
        bar(m.budget_bytes, [[m.overhead_bytes, "reserved"], [m.used_bytes, m.used_bytes > m.budget_bytes ? "over" : ""],
                             [Math.max(0, m.reserved_bytes - m.used_bytes), "reserved"]],
            `${bytes(m.used_bytes)} used of ${bytes(m.budget_bytes)}`),
        el("span", { class: "figures" },
          `${bytes(m.used_bytes)} used of ${bytes(m.budget_bytes)}`,
          ` (${bytes(Math.max(0, free))} free`,
          m.overhead_bytes ? `, ${bytes(m.overhead_bytes)} runtime` : "",
          `), ${m.waiting_loads} load${m.waiting_loads === 1 ? "" : "s"} waiting for room`));
    });
  }

  function diskRow(disk) {
    const free = disk.budget_bytes - disk.used_bytes;
    const pulling = disk.pulling.reduce((n, p) => n + p.bytes, 0);
    return el("div", { class: "device", "data-device": "disk" },
      el("strong", {}, "disk"),
      bar(disk.budget_bytes, [[disk.used_bytes, disk.used_bytes > disk.budget_bytes ? "over" : ""],
                              [pulling, "reserved"]],
          `${bytes(disk.used_bytes)} on disk of ${bytes(disk.budget_bytes)}`),
      el("span", { class: "figures" },
        `${bytes(disk.used_bytes)} on disk of ${bytes(disk.budget_bytes)}`,
        ` (${bytes(Math.max(0, free))} free), ${disk.versions} version${disk.versions === 1 ? "" : "s"}`,
        `, ${disk.pulling.length} pulling, ${disk.pulls} pull${disk.pulls === 1 ? "" : "s"}`,
        `, ${disk.evictions} eviction${disk.evictions === 1 ? "" : "s"}`));
  }

  function stateLabel(m) {
    if (m.phase !== "downloading") return m.state;
    const d = m.download;
    return d && d.total_bytes ? `downloading ${pct(d.bytes / d.total_bytes)}` : "downloading";
  }

  function summary(models) {
    const sum = (key) => models.reduce((n, m) => n + (m[key] || 0), 0);
    const hits = sum("hits"), misses = sum("misses");
    const tiles = [
      ["resident", `${models.filter((m) => m.state === "ready").length} / ${models.length}`],
      ["pinned", models.filter((m) => m.pinned).length],
      ["loads", sum("loads")], ["evictions", sum("evictions")],
      ["on disk", models.filter((m) => m.on_disk).length],
      ["hit ratio", pct(hits + misses ? hits / (hits + misses) : null)],
      ["requests served", sum("requests_served")], ["SLO violations", sum("slo_violations")],
      ["dropped", sum("drops_total")],
    ];
    return tiles.map(([label, value]) => el("div", { class: "tile", "data-tile": label },
      el("div", { class: "value" }, value), el("div", { class: "label" }, label)));
  }

  function modelRow(m, budgets) {
    const budget = budgets[m.device];
    const lookups = m.hits + m.misses;
    const latency = m.latency_at_slo_percentile_ms;
    const late = latency !== null && m.slo_latency_ms && latency > m.slo_latency_ms;
    const pctLabel = m.slo_percentile === undefined ? "" : ` (p${m.slo_percentile})`;
    return el("tr", { "data-model": m.name, "data-version": m.version },
      el("td", { class: "name" }, m.name),
      el("td", { class: "num" }, m.version),
      el("td", {}, m.device),
      el("td", { class: "state" },
        el("span", { class: "badge " + m.state, title: m.error || (m.source ? `from ${m.source}` : "") },
          stateLabel(m))),
      el("td", { class: "num size" }, m.size_bytes ? bytes(m.size_bytes) + (m.size_estimated ? " (est.)" : "") : "–"),
      el("td", {}, budget ? bar(budget, [[m.state === "ready" ? m.size_bytes : 0, ""]],
                               `${pct(m.size_bytes / budget)} of the ${m.device} budget`) : "–"),
      el("td", { class: "pinned" }, m.pinned ? "pinned" : ""),
      el("td", { class: "num loads" }, m.loads),
      el("td", { class: "num evictions" }, m.evictions),
      el("td", { class: "num" }, pct(lookups ? m.hits / lookups : null)),
      el("td", { class: "num latency" + (late ? " late" : "") }, ms(latency)),
      el("td", { class: "num" }, ms(m.slo_latency_ms) + pctLabel),
      el("td", {}, m.slo_latency_ms ? bar(m.slo_latency_ms, [[latency || 0, late ? "over" : ""]],
                                          `latency ${ms(latency)} of SLO ${ms(m.slo_latency_ms)}`) : "–"),
      el("td", { class: "num queue" }, m.queue_length ?? 0),
      el("td", { class: "num" }, m.in_flight));
  }

  const SERIES = [
    { key: "mean_response_seconds", label: "mean response", color: "#3b6fd8", dash: "" },
    { key: "p99_response_seconds", label: "p99 response", color: "#3b6fd8", dash: "6 4" },
    { key: "mean_load_delay_seconds", label: "load delay per request", color: "#b7791f", dash: "" }];

  function seconds(v) {
    return v === 0 ? "0" : v < 1 ? `${Number((1000 * v).toPrecision(3))} ms` : `${Number(v.toPrecision(3))} s`;
  }

  // Response and load delay (seconds) against capacity (log2 scale), one line per
  // series; the node's own budget marked.
  function whatifChart(curve) {
    return Chart.lines({
      title: "response and load delay against capacity",
      xTitle: "cache capacity (log scale; the twin's multiples of the budget)",
      yTitle: "time per request",
      series: SERIES, points: curve.points,
      x: (p) => Math.log2(p.capacity_bytes),
      xTicks: curve.points.map((p) => ({ x: Math.log2(p.capacity_bytes), label: bytes(p.capacity_bytes) })),
      yFormat: seconds,
      tooltip: (s, p) => `${s.label} at ${bytes(p.capacity_bytes)}: ${ms(1000 * p[s.key])}, ${p.loads} loads`,
      pointData: (p) => ({ "data-capacity": p.capacity_bytes }),
      markers: [{ x: Math.log2(curve.budget_bytes), label: "this node's budget", color: "#1f8a4c",
                  dash: "2 3", class: "budget" }],
    });
  }

  function showWhatif(curve) {
    const note = document.getElementById("whatif-note");
    const box = document.getElementById("whatif");
    if (!curve.points.length) {
      note.textContent = `no requests in the last hour to replay (${curve.requests} recorded)`;
      box.replaceChildren();
      return;
    }
    note.textContent = `${curve.requests} requests of the last hour through the agent's ` +
      `twin (policy ${curve.policy}), at multiples of the cpu budget`;
    box.replaceChildren(whatifChart(curve));
  }

  function routingNote(r) {
    if (!r.enabled) return "routing off: every request is served here";
    const table = r.version === null ? "no routing table yet"
      : `table ${r.version}, confirmed ${r.age_s}s ago (trusted for ${r.max_age_s}s)` +
        (r.trusted ? "" : ": too old, every request is served here");
    const peers = Object.entries(r.peers).map(([name, p]) => `${name} ${p.up ? "up" : "down"}`);
    return `node ${r.node}; ${table}` + (peers.length ? `; peers: ${peers.join(", ")}` : "");
  }

  function routingRows(r) {
    const rows = [];
    for (const [model, m] of Object.entries(r.models)) {
      const planned = Object.entries(m.planned).map(([n, k]) => `${n}×${k}`).join(", ") || "–";
      const peers = Object.entries(m.peers);
      const fallbacks = Object.entries(m.fallback_reasons || {}).map(([k, v]) => `${v} ${k}`)
        .join(", ") || "0";
      const cells = (peer, p) => [
        el("td", { class: "name" }, model), el("td", {}, planned), el("td", {}, peer),
        el("td", { class: "num" }, p ? p.forwarded : 0), el("td", { class: "num" }, p ? p.errors : 0),
        el("td", { class: "num" }, p ? ms(p.hop_ms.p50) : "–"),
        el("td", { class: "num" }, fallbacks), el("td", { class: "num" }, m.received)];
      if (!peers.length) rows.push(el("tr", { "data-model": model }, ...cells("–", null)));
      for (const [peer, p] of peers) {
        rows.push(el("tr", { "data-model": model, "data-peer": peer }, ...cells(peer, p)));
      }
    }
    return rows;
  }

  // A selection app: its members' weights (a bar each) and answers, its confidence
  // (the mean, and the histogram of each answer's lowest row).
  function selectionApp(app) {
    const confidence = Object.entries(app.confidence_histogram);
    const answers = confidence.reduce((n, [, count]) => n + count, 0);
    const most = Math.max(1, ...confidence.map(([, count]) => count));
    const missing = (m) => Object.entries(m.missing).map(([why, n]) => `${why} ${n}`).join(", ");
    return el("div", { class: "app", "data-app": app.app },
      el("h3", {}, app.app, el("span", { class: "meta" },
        `${app.policy}${app.frozen ? " (frozen)" : ""} · ${app.requests} request${app.requests === 1 ? "" : "s"}` +
        ` · ${app.feedback.accepted} with feedback · ${app.default_answers} default answer${app.default_answers === 1 ? "" : "s"}` +
        (app.error ? ` · ${app.error}` : ""))),
      el("div", { class: "app-body" },
        el("table", { class: "members" },
          el("thead", {}, el("tr", {}, el("th", {}, "Member"), el("th", {}, "Weight"), el("th", { class: "num" }, ""),
                             el("th", { class: "num" }, "Selected"), el("th", { class: "num" }, "Answered"),
                             el("th", {}, "Missing"))),
          el("tbody", {}, app.members.map((m) => el("tr", { "data-member": m.member },
            el("td", { class: "name" }, m.member),
            el("td", {}, bar(1, [[m.weight, ""]], `weight ${pct(m.weight)}`)),
            el("td", { class: "num weight" }, pct(m.weight)),
            el("td", { class: "num" }, m.selected),
            el("td", { class: "num answered" }, m.answered),
            el("td", { class: "missing" }, missing(m) || "–"))))),
        el("div", { class: "confidence" },
          el("div", { class: "confidence-mean" },
            el("span", { class: "value" }, app.confidence_mean === null ? "–" : app.confidence_mean.toFixed(2)),
            el("span", { class: "label" }, "mean confidence")),
          el("div", { class: "histogram", role: "img",
                      "aria-label": `confidence of ${answers} answers by bucket` },
            confidence.map(([upper, count], i) => el("div", { class: "bucket", "data-bucket": upper,
                                                              title: `${count} answer${count === 1 ? "" : "s"}` },
              el("span", { class: "count" }, count),
              el("span", { class: "fill", style: `height:${(100 * count / most).toFixed(1)}%` }),
              el("span", { class: "label" }, `${i ? confidence[i - 1][0] : "0"}–${upper}`)))))));
  }

  function showSelection(apps) {
    document.getElementById("selection-section").hidden = apps.length === 0;
    document.getElementById("selection").replaceChildren(...apps.map(selectionApp));
  }

  // The page's panels: each names the API paths it draws (data: {path: body}); a panel
  // is added here and in node.html.
  const PANELS = [
    { paths: ["/v1/memory", "/v1/disk"], draw: (d) => document.getElementById("memory")
      .replaceChildren(...memoryRows(d["/v1/memory"]), diskRow(d["/v1/disk"])) },
    { paths: ["/v1/cache"], draw: (d) => document.getElementById("summary")
      .replaceChildren(...summary(d["/v1/cache"])) },
    { paths: ["/v1/whatif"], draw: (d) => showWhatif(d["/v1/whatif"]) },
    { paths: ["/v1/selection"], draw: (d) => showSelection(d["/v1/selection"]) },
    { paths: ["/v1/routing"], draw: (d) => {
      document.getElementById("routing-note").textContent = routingNote(d["/v1/routing"]);
      replaceRows(document.querySelector("#routing tbody"), routingRows(d["/v1/routing"]), 8,
                  "nothing routed");
    } },
    { paths: ["/v1/cache", "/v1/memory"], draw: (d) => {
      const budgets = Object.fromEntries(Object.entries(d["/v1/memory"]).map(([dev, m]) => [dev, m.budget_bytes]));
      replaceRows(document.querySelector("#models tbody"),
                  d["/v1/cache"].map((m) => modelRow(m, budgets)), 15, "no models in the repository");
    } },
  ];

  let server = null;

  async function update() {
    if (server === null) {
      server = await api("/v2");
      document.getElementById("server").textContent = `${server.name} ${server.version} · ${location.host}`;
    }
    const paths = [...new Set(PANELS.flatMap((p) => p.paths))];
    const bodies = await Promise.all(paths.map((path) => api(path)));
    const data = Object.fromEntries(paths.map((path, i) => [path, bodies[i]]));
    for (const panel of PANELS) panel.draw(data);
  }

  poll(update);
})();
