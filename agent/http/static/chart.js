// An SVG line chart for the dashboards: both axes titled, ticks at round values (the x
// axis may give its own), light grid lines, one path per series with its points (a
// tooltip each), vertical markers, and a legend whose entries show each line's sample.
"use strict";

const Chart = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const AXIS = "#5f6b7a", GRID = "#e3e7ec";

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(NS, tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value !== undefined && value !== null) node.setAttribute(key, String(value));
    }
    for (const child of children) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // About `count` round values (1, 2 or 5 × 10^k apart) from 0 to at least `top`.
  function ticks(top, count = 5) {
    const raw = (top > 0 ? top : 1) / count;
    const magnitude = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((s) => s >= raw);
    const values = [];
    for (let i = 0; values.length === 0 || values[values.length - 1] < top; i++) {
      values.push(Number((i * step).toPrecision(12)));
    }
    return values;
  }

  // spec: {title, xTitle, yTitle, series: [{key, label, color, dash}], points,
  //        x: point => x (already scaled, e.g. log2), xTicks: [{x, label}],
  //        yFormat: y => text, tooltip: (series, point) => text, pointData: point => {},
  //        markers: [{x, label, color, dash, class}]}
  function lines(spec) {
    const W = 960, H = 320, L = 72, R = 210, T = 14, B = 52;
    const xs = spec.points.map(spec.x);
    const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
    const values = spec.points.flatMap((p) => spec.series.map((s) => p[s.key]))
      .filter((v) => v !== null && v !== undefined && isFinite(v));
    const yTicks = ticks(Math.max(...values, 1e-3) * 1.05);
    const top = yTicks[yTicks.length - 1];
    const X = (v) => L + (W - L - R) * (v - x0) / (x1 - x0);
    const Y = (v) => T + (H - T - B) * (1 - v / top);
    const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
                               "aria-label": spec.title });
    for (const v of yTicks) {
      chart.append(svg("line", { class: "grid", x1: L, y1: Y(v), x2: W - R, y2: Y(v),
                                 stroke: GRID }),
                   svg("text", { class: "tick y", x: L - 6, y: Y(v) + 4, "text-anchor": "end",
                                 "font-size": 11 }, spec.yFormat(v)));
    }
    for (const t of spec.xTicks) {
      chart.append(svg("line", { x1: X(t.x), y1: H - B, x2: X(t.x), y2: H - B + 4,
                                 stroke: AXIS }),
                   svg("text", { class: "tick x", x: X(t.x), y: H - B + 17,
                                 "text-anchor": "middle", "font-size": 11 }, t.label));
    }
    chart.append(
      svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: AXIS }),
      svg("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: AXIS }),
      svg("text", { class: "axis-title x", x: (L + W - R) / 2, y: H - 10,
                    "text-anchor": "middle", "font-size": 12 }, spec.xTitle),
      svg("text", { class: "axis-title y", x: 14, y: (T + H - B) / 2, "font-size": 12,
                    "text-anchor": "middle", transform: `rotate(-90 14 ${(T + H - B) / 2})` },
          spec.yTitle));
    for (const m of spec.markers || []) {
      chart.append(svg("line", { class: m.class, x1: X(m.x), y1: T, x2: X(m.x), y2: H - B,
                                 stroke: m.color, "stroke-dasharray": m.dash }));
    }
    for (const s of spec.series) {
      const drawn = spec.points.filter((p) => p[s.key] !== null && p[s.key] !== undefined);
      const path = drawn.map((p, j) => `${j ? "L" : "M"}${X(spec.x(p))},${Y(p[s.key])}`);
      chart.append(svg("path", { d: path.join(" "), fill: "none", stroke: s.color,
                                 "stroke-width": 2, "stroke-dasharray": s.dash || "none",
                                 "data-series": s.key }));
      for (const p of drawn) {
        chart.append(svg("circle", { cx: X(spec.x(p)), cy: Y(p[s.key]), r: 3, fill: s.color,
                                     "data-series": s.key, "data-value": p[s.key],
                                     ...(spec.pointData ? spec.pointData(p) : {}) },
                         svg("title", {}, spec.tooltip(s, p))));
      }
    }
    // the legend: a sample of each line (its colour and dash), then its label
    const legend = svg("g", { class: "legend" });
    const entries = [...spec.series.map((s) => ({ ...s, width: 2 })),
                     ...(spec.markers || []).map((m) => ({ ...m, width: 1.5 }))];
    entries.forEach((e, i) => {
      const y = T + 10 + 20 * i, x = W - R + 14;
      legend.append(svg("line", { x1: x, y1: y, x2: x + 28, y2: y, stroke: e.color,
                                  "stroke-width": e.width, "stroke-dasharray": e.dash || "none" }),
                    svg("text", { x: x + 36, y: y + 4, "font-size": 12 }, e.label));
    });
    chart.append(legend);
    return chart;
  }

  return { lines, ticks };
})();
