// The coordinator's dashboard: the first NODES_SHOWN nodes by name of GET /v1/nodes
// (a page: a fleet of 10,000 is 30 MB), /v1/plan (404 until a first plan),
// /v1/models (with the worst latency its live nodes measured at the model's SLO
// percentile) and the last ROLLOUTS_SHOWN /v1/rollouts, refreshed every ?refresh= ms.
// PANELS below: what each part of the page draws from which paths.
"use strict";

(() => {
  const { api, el, bytes, ms, pct, bar, replaceRows, poll } = Dash;
  const NODES_SHOWN = 100;
  const PLACEMENT_SHOWN = 8;
  const ROLLOUTS_SHOWN = 10;

  function nodeRow(n) {
    const cap = n.capacity || {};
    const resident = Object.entries(n.models || {}).filter(([, m]) => m.resident).map(([name]) => name);
    const d = n.directives;
    const directives = d ? [
      d.pin && d.pin.length ? "pin " + d.pin.join(", ") : null,
      d.prefetch && d.prefetch.length ? "prefetch " + d.prefetch.join(", ") : null,
      Object.keys(d.workers || {}).length
        ? "workers " + Object.entries(d.workers).map(([m, w]) => `${m}×${w}`).join(", ") : null,
    ].filter(Boolean).join("; ") || "none" : "–";
    return el("tr", { "data-node": n.name },
      el("td", { class: "name" }, n.name),
      el("td", {}, el("span", { class: "badge " + (n.alive ? "alive" : "down") }, n.alive ? "alive" : "silent")),
      el("td", { class: "num" }, `${n.age_s.toFixed(1)} s ago`),
      el("td", { class: "num" }, cap.cores ?? "–"),
      el("td", { class: "num" }, bytes(cap.cpu_memory_bytes)),
      el("td", {}, (cap.gpus || []).map((g) => `${g.device} ${bytes(g.memory_bytes)}`).join(", ") || "–"),
      el("td", { class: "resident" }, resident.join(", ") || "–"),
      el("td", {}, directives));
  }

  function planTiles(plan) {
    if (!plan) return [el("div", { class: "empty", id: "no-plan" }, "no plan yet")];
    const tiles = [
      ["plan", "#" + plan.id], ["kind", plan.kind],
      ["made", new Date(plan.created * 1000).toLocaleTimeString()],
      ["objective", `${plan.objective ?? "–"} = ${plan.objective_value === undefined || plan.objective_value === null ? "–" : Number(plan.objective_value).toFixed(3)}`],
      ["models", Object.keys(plan.models || {}).length],
      ["replicas", Object.values(plan.models || {}).reduce((n, m) => n + (m.replicas || 0), 0)],
    ];
    return tiles.map(([label, value]) => el("div", { class: "tile", "data-tile": label },
      el("div", { class: "value" }, value), el("div", { class: "label" }, label)));
  }

  function placementText(planned) {
    const entries = Object.entries(planned.placement || {});
    const hidden = entries.length - PLACEMENT_SHOWN;
    const more = hidden > 0 ? [`… ${hidden} more node${hidden === 1 ? "" : "s"}`] : [];
    return [...entries.slice(0, PLACEMENT_SHOWN).map(([node, n]) => `${node}×${n}`), ...more].join(", ")
      + (planned.unplaced ? ` (+${planned.unplaced} unplaced)` : "");
  }

  function modelRow(name, planned, catalog) {
    const slo = planned ? planned.slo_ms : catalog ? catalog.slo_ms : null;
    const percentile = planned ? planned.percentile : catalog ? catalog.percentile : 99;
    const seen = catalog ? catalog.measured_latency_ms : null;
    const late = seen !== null && slo && seen > slo;
    const placement = planned ? placementText(planned) : "";
    return el("tr", { "data-model": name },
      el("td", { class: "name" }, name),
      el("td", { class: "num replicas" }, planned ? planned.replicas : "–"),
      el("td", { class: "placement" }, placement || "–"),
      el("td", { class: "num" }, planned ? `${Number(planned.rate).toFixed(2)}/s` : "–"),
      el("td", { class: "num" }, slo ? `${ms(slo)} (p${percentile})` : "–"),
      el("td", { class: "num predicted" }, ms(planned ? planned.predicted_latency_ms : null)),
      el("td", { class: "num measured" + (late ? " late" : "") }, ms(seen)),
      el("td", {}, slo ? bar(slo, [[seen || 0, late ? "over" : ""]], `measured ${ms(seen)} of SLO ${ms(slo)}`) : "–"),
      el("td", { class: "num" }, planned ? pct(planned.drop_rate) : "–"),
      el("td", { class: "num" }, planned && planned.utility !== undefined ? Number(planned.utility).toFixed(3) : "–"),
      el("td", { class: "routed" }, routedText(catalog ? catalog.routed : null)));
  }

  // Which node served how much of the model over its last report interval, and what
  // the nodes forwarded (routing nodes only; the first PLACEMENT_SHOWN nodes).
  function routedText(routed) {
    const entries = Object.entries(routed || {});
    if (!entries.length) return "–";
    const shown = entries.slice(0, PLACEMENT_SHOWN).map(([node, r]) =>
      `${node} ${r.served}` + (r.forwarded ? ` (→${r.forwarded})` : "") +
      (r.fallbacks ? ` (${r.fallbacks} fallback${r.fallbacks === 1 ? "" : "s"})` : ""));
    const hidden = entries.length - PLACEMENT_SHOWN;
    return shown.join(", ") + (hidden > 0 ? `, … ${hidden} more` : "");
  }

  function rolloutRow(r) {
    const f = r.figures || {};
    const side = (x) => [
      el("td", { class: "num" }, x ? Number(x.requests).toFixed(0) : "–"),
      el("td", { class: "num" }, x ? pct(x.error_rate) : "–"),
      el("td", { class: "num" }, ms(x ? x.latency_ms : null))];
    const active = r.state === "running" || r.state === "paused";
    const wave = `${r.wave}/${r.waves.length}` + (active ? ` ${r.phase}` : "");
    return el("tr", { "data-rollout": r.id },
      el("td", { class: "num" }, "#" + r.id),
      el("td", { class: "name" }, r.model),
      el("td", {}, `${r.from.version} → ${r.to.version}`),
      el("td", {}, el("span", { class: "badge " + (r.state === "rolled_back" ? "down" : "alive") }, r.state)),
      el("td", { class: "wave" }, wave),
      ...side(f.new), ...side(f.old),
      el("td", { class: "reason" }, r.reason || "–"));
  }

  function drawNodes(nodes, headers) {
    const total = Number(headers.get("X-Total-Count") ?? nodes.length);
    document.getElementById("nodes-shown").textContent = total > nodes.length
      ? `the first ${nodes.length} of ${total.toLocaleString()} by name` : `${total}`;
    replaceRows(document.querySelector("#nodes tbody"), nodes.map(nodeRow), 8,
                "no node has reported yet");
  }

  function drawModels(catalog, plan) {
    const byName = Object.fromEntries(catalog.map((m) => [m.name, m]));
    const names = [...new Set([...Object.keys((plan && plan.models) || {}), ...Object.keys(byName)])].sort();
    replaceRows(document.querySelector("#models tbody"),
                names.map((name) => modelRow(name, plan && plan.models ? plan.models[name] : null, byName[name])),
                11, "no models in the catalog or the plan");
  }

  const NODES = `/v1/nodes?limit=${NODES_SHOWN}`;
  const ROLLOUTS = `/v1/rollouts?limit=${ROLLOUTS_SHOWN}`;
  const FETCH = {
    [NODES]: () => api(NODES, true),
    "/v1/plan": () => api("/v1/plan").catch((error) => { if (error.status === 404) return null; throw error; }),
  };
  const PANELS = [
    { paths: [NODES], draw: (d) => drawNodes(...d[NODES]) },
    { paths: ["/v1/plan"], draw: (d) => document.getElementById("plan-summary").replaceChildren(...planTiles(d["/v1/plan"])) },
    { paths: ["/v1/models", "/v1/plan"], draw: (d) => drawModels(d["/v1/models"], d["/v1/plan"]) },
    { paths: [ROLLOUTS], draw: (d) => {
      document.getElementById("rollouts-shown").textContent = d[ROLLOUTS].length
        ? `the last ${d[ROLLOUTS].length}` : "";
      replaceRows(document.querySelector("#rollouts tbody"), d[ROLLOUTS].map(rolloutRow), 12,
                  "no rollout yet");
    } },
  ];

  async function update() {
    document.getElementById("server").textContent = location.host;
    const paths = [...new Set(PANELS.flatMap((p) => p.paths))];
    const bodies = await Promise.all(paths.map((path) => (FETCH[path] || (() => api(path)))()));
    const data = Object.fromEntries(paths.map((path, i) => [path, bodies[i]]));
    for (const panel of PANELS) panel.draw(data);
  }

  poll(update);
})();
