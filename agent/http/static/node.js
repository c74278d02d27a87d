// The agent's dashboard: GET /v2 (name, version), /v1/memory (budgets), /v1/disk (the
// disk tier of pulled models), /v1/cache (models), /v1/whatif (the twin's curve; these
// need a read token where the agent has tokens), refreshed every ?refresh= ms.
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

  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
    for (const child of children) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  const SERIES = [["mean_response_seconds", "mean response", "#3b6fd8", ""],
                  ["p99_response_seconds", "p99 response", "#3b6fd8", "5 4"],
                  ["mean_load_delay_seconds", "load delay per request", "#b7791f", ""]];

  // Response and load delay (seconds) against capacity (log2), one line per series;
  // the node's own budget marked.
  function whatifChart(curve) {
    const points = curve.points;
    const W = 640, H = 260, L = 56, R = 170, T = 12, B = 40;
    const xs = points.map((p) => Math.log2(p.capacity_bytes));
    const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
    const top = Math.max(...points.flatMap((p) => SERIES.map(([k]) => p[k])), 1e-3) * 1.1;
    const X = (c) => L + (W - L - R) * (Math.log2(c) - x0) / (x1 - x0);
    const Y = (v) => T + (H - T - B) * (1 - v / top);
    const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
                               "aria-label": "response and load delay against capacity" });
    chart.append(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#5f6b7a" }),
                 svg("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#5f6b7a" }),
                 svg("text", { x: L - 6, y: T + 4, "text-anchor": "end", "font-size": 11 },
                     top.toFixed(2) + " s"),
                 svg("text", { x: L - 6, y: H - B, "text-anchor": "end", "font-size": 11 }, "0"));
    const budget = curve.budget_bytes;
    chart.append(svg("line", { class: "budget", x1: X(budget), y1: T, x2: X(budget), y2: H - B,
                               stroke: "#1f8a4c", "stroke-dasharray": "2 3" }));
    for (const p of points) {
      chart.append(svg("text", { x: X(p.capacity_bytes), y: H - B + 16, "text-anchor": "middle",
                                 "font-size": 11 }, bytes(p.capacity_bytes)));
    }
    SERIES.forEach(([key, label, color, dash], i) => {
      const path = points.map((p, j) => `${j ? "L" : "M"}${X(p.capacity_bytes)},${Y(p[key])}`);
      chart.append(svg("path", { d: path.join(" "), fill: "none", stroke: color,
                                 "stroke-width": 2, "stroke-dasharray": dash || "none" }));
      for (const p of points) {
        chart.append(svg("circle", { cx: X(p.capacity_bytes), cy: Y(p[key]), r: 3, fill: color,
                                     "data-series": key, "data-capacity": p.capacity_bytes,
                                     "data-value": p[key] },
                         svg("title", {}, `${label} at ${bytes(p.capacity_bytes)}: ` +
                             ms(1000 * p[key]) + `, ${p.loads} loads`)));
      }
      chart.append(svg("text", { x: W - R + 10, y: T + 14 + 16 * i, fill: color,
                                 "font-size": 12 }, label));
    });
    chart.append(svg("text", { x: W - R + 10, y: T + 14 + 16 * SERIES.length,
                               fill: "#1f8a4c", "font-size": 12 }, "this node's budget"));
    return chart;
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

  let server = null;

  async function update() {
    if (server === null) {
      server = await api("/v2");
      document.getElementById("server").textContent = `${server.name} ${server.version} · ${location.host}`;
    }
    const [memory, disk, models, curve] = await Promise.all(
      [api("/v1/memory"), api("/v1/disk"), api("/v1/cache"), api("/v1/whatif")]);
    showWhatif(curve);
    document.getElementById("memory").replaceChildren(...memoryRows(memory), diskRow(disk));
    document.getElementById("summary").replaceChildren(...summary(models));
    const budgets = Object.fromEntries(Object.entries(memory).map(([d, m]) => [d, m.budget_bytes]));
    replaceRows(document.querySelector("#models tbody"), models.map((m) => modelRow(m, budgets)),
                15, "no models in the repository");
  }

  poll(update);
})();
