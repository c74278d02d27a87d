// Shared by the agent's and the coordinator's dashboard: polling the server's own JSON
// API (with the token the user gives where the server asks for one: a read token does),
// formatting, DOM building.
"use strict";

const Dash = (() => {
  const TOKEN_KEY = "edgeagent-token";
  const params = new URLSearchParams(location.search);
  const refreshMs = Math.max(250, Number(params.get("refresh")) || 2000);
  const REFRESH_SHARE = 0.1;  // of the time, at most, spent refreshing

  class NeedsToken extends Error {}

  // GET path's JSON body; with `withHeaders`, [body, response headers].
  async function api(path, withHeaders = false) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    const response = await fetch(path, { headers, cache: "no-store" });
    if (response.status === 401 || response.status === 403) {
      throw new NeedsToken(response.status === 401 ? "this server needs a token (scope read)"
                           : "this token lacks the read scope: give a read token");
    }
    const body = await response.json().catch(() => null);
    if (!response.ok) {
      const error = new Error((body && body.error) || `${path}: HTTP ${response.status}`);
      error.status = response.status;
      throw error;
    }
    return withHeaders ? [body, response.headers] : body;
  }

  // el("td", {class: "num"}, "text", child, ...): text is always text, never markup.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "style") node.style.cssText = value;
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(n < 10 ? 2 : 1)) + " " + units[i];
  }

  function ms(x) {
    if (x === null || x === undefined) return "–";
    return x < 10 ? x.toFixed(2) + " ms" : x < 1000 ? x.toFixed(1) + " ms"
      : (x / 1000).toFixed(2) + " s";
  }

  function pct(x) {
    return x === null || x === undefined || !isFinite(x) ? "–" : (100 * x).toFixed(1) + " %";
  }

  // A bar of value/total; parts: [[value, className], ...] stacked from the left.
  function bar(total, parts, title) {
    const node = el("div", { class: "bar", title, role: "img", "aria-label": title });
    let left = 0;
    for (const [value, cls] of parts) {
      const width = total > 0 ? Math.min(100 - left, 100 * value / total) : 0;
      if (width <= 0) continue;
      node.append(el("span", { class: cls || "", style: `left:${left}%;width:${width}%` }));
      left += width;
    }
    return node;
  }

  function replaceRows(tbody, rows, columns, emptyText) {
    tbody.replaceChildren(...(rows.length ? rows : [
      el("tr", {}, el("td", { colspan: columns, class: "empty" }, emptyText))]));
  }

  // Run update() now and every refreshMs, or REFRESH_SHARE⁻¹ times as long as the last
  // update took where that is longer (a page on a fleet of 10,000 nodes must not keep
  // the coordinator busy); show its state in #status; ask for the token
  // (form#token-form) when the server answers 401 or 403.
  function poll(update) {
    const status = document.getElementById("status");
    const form = document.getElementById("token-form");
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, form.elements.token.value.trim());
      form.elements.token.value = "";
      form.hidden = true;
      tick();
    });
    let timer = null;
    async function tick() {
      clearTimeout(timer);
      const started = performance.now();
      try {
        await update();
        form.hidden = true;
        status.textContent = "updated " + new Date().toLocaleTimeString();
        status.className = "status";
        document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
      } catch (error) {
        if (error instanceof NeedsToken) {
          form.hidden = false;
          status.textContent = error.message;
        } else {
          status.textContent = "error: " + error.message;
        }
        status.className = "status error";
      }
      timer = setTimeout(tick, Math.max(refreshMs, (performance.now() - started) / REFRESH_SHARE));
    }
    tick();
  }

  return { api, el, bytes, ms, pct, bar, replaceRows, poll, NeedsToken };
})();
