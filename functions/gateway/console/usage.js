// inferq console, the usage view (GET /v1/usage): what a tenant used over a range, for chargeback. An operator
// (INFERQ_ADMIN_TENANTS) sees every tenant's: a chart of the range stacked by tenant, and a table per tenant with
// tokens, GPU-hours and the estimated cost; a tenant's key sees its own, per model and lane. Loaded before app.js,
// which calls refreshUsage() when the view is shown; uses its api(), el(), svg(), fmt(), $() and niceCeil().
"use strict";

const USAGE_RANGES = { "24h": [86400, "hour"], "7d": [7 * 86400, "day"], "30d": [30 * 86400, "day"] };
const USAGE_COLORS = ["#1f4e79", "#d97706", "#2e7d32", "#8e24aa", "#c62828", "#00838f", "#6d4c41", "#546e7a"];
const USAGE_STACKED = 7; // tenants drawn on their own in the chart; the rest as "others"

function usageTotals(rows) {
  const t = { succeeded: 0, failed: 0, cancelled: 0, expired: 0, tokens: 0, prompt: 0, completion: 0,
    gpu: 0, run: 0, usd: 0, priced: false };
  for (const r of rows) {
    for (const s of ["succeeded", "failed", "cancelled", "expired"]) t[s] += r.jobs[s];
    t.prompt += r.prompt_tokens;
    t.completion += r.completion_tokens;
    t.tokens += r.prompt_tokens + r.completion_tokens;
    t.gpu += r.gpu_seconds;
    t.run += r.run_seconds;
    if ("estimated_cost_usd" in r) { t.usd += r.estimated_cost_usd; t.priced = true; }
  }
  return t;
}

// GPU time in the unit that shows it: a mock's milliseconds and a month's thousands of hours alike
function gpuTime(seconds) {
  if (seconds < 60) return `${seconds.toLocaleString("en-US", { maximumFractionDigits: seconds < 1 ? 3 : 1 })} s`;
  if (seconds < 3600) return `${(seconds / 60).toLocaleString("en-US", { maximumFractionDigits: 1 })} min`;
  return `${(seconds / 3600).toLocaleString("en-US", { maximumFractionDigits: 2 })} h`;
}
const dollars = (usd) => `$${usd.toLocaleString("en-US", usd && usd < 0.01
  ? { maximumSignificantDigits: 2 } : { minimumFractionDigits: 2, maximumFractionDigits: 2 })}`;

async function refreshUsage() {
  const [seconds, bucket] = USAGE_RANGES[$("usage-range").value] || USAGE_RANGES["24h"];
  const now = Math.floor(Date.now() / 1000);
  const start = now - seconds;
  const base = `v1/usage?start=${start}&end=${now}&bucket=${bucket}`;
  let answer;
  let everyTenant = false;
  try {
    answer = await api("GET", `${base}&tenant=*`); // an operator's key: every tenant
    everyTenant = true;
  } catch (err) {
    if (err.status !== 403) { usageFailed(err); return; }
    try { answer = await api("GET", base); } catch (again) { usageFailed(again); return; }
  }
  const rows = answer.data || [];
  $("usage-scope").textContent = everyTenant ? "Every tenant (operator key)." : `Tenant ${answer.tenant}.`;
  drawUsageChart(rows, { start, now, bucket, seconds, everyTenant });
  renderUsageTable(rows, everyTenant);
  $("usage-updated").textContent = `Updated ${new Date().toLocaleTimeString()}`;
}

function usageFailed(err) {
  if (err.status !== 401) notice(`Usage unavailable: ${err.message}`, true);
}

// One bar per hour or day of the range, its height the tokens that ended in it, stacked by tenant (operators) or
// by model (a tenant's own view).
function drawUsageChart(rows, { start, now, bucket, seconds, everyTenant }) {
  const step = bucket === "hour" ? 3600 : 86400;
  const first = start - (start % step);
  const slots = Math.max(1, Math.ceil((now - first) / step));
  const groupOf = (r) => (everyTenant ? r.tenant : r.model);
  const byGroup = new Map();
  for (const r of rows) byGroup.set(groupOf(r), (byGroup.get(groupOf(r)) || 0) + r.prompt_tokens + r.completion_tokens);
  const ranked = [...byGroup.entries()].sort((a, b) => b[1] - a[1]).map(([g]) => g);
  const shown = ranked.slice(0, USAGE_STACKED);
  const colorOf = (g) => USAGE_COLORS[shown.includes(g) ? shown.indexOf(g) : USAGE_COLORS.length - 1];
  const bars = Array.from({ length: slots }, () => new Map());
  for (const r of rows) {
    const slot = Math.floor(((r.start || first) - first) / step);
    if (slot < 0 || slot >= slots) continue;
    const group = shown.includes(groupOf(r)) ? groupOf(r) : "others";
    bars[slot].set(group, (bars[slot].get(group) || 0) + r.prompt_tokens + r.completion_tokens);
  }
  const W = 720, H = 220, L = 56, R = 10, T = 10, B = 28;
  const box = $("chart-usage");
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-labelledby": "usage-chart-title" });
  root.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  root.append(svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  const totals = bars.map((bar) => [...bar.values()].reduce((a, b) => a + b, 0));
  const max = Math.max(...totals, 0);
  const desc = svg("desc");
  root.append(desc);
  const width = (W - L - R) / slots;
  root.append(svg("text", { x: L, y: H - 8 }, `−${Math.round(seconds / step)} ${bucket === "hour" ? "h" : "d"}`));
  root.append(svg("text", { x: W - R, y: H - 8, "text-anchor": "end" }, "now"));
  if (!max) {
    root.append(svg("text", { class: "empty", x: (W + L) / 2, y: H / 2, "text-anchor": "middle" }, "no usage"));
    desc.textContent = "no usage in the range";
  } else {
    const top = niceCeil(max);
    root.append(svg("text", { x: L - 6, y: T + 8, "text-anchor": "end" }, fmt(top)));
    root.append(svg("text", { x: L - 6, y: H - B, "text-anchor": "end" }, "0"));
    bars.forEach((bar, i) => {
      let base = H - B;
      for (const group of [...shown, "others"]) {
        const value = bar.get(group) || 0;
        if (!value) continue;
        const h = (value / top) * (H - B - T);
        base -= h;
        root.append(svg("rect", { class: "bar", x: (L + i * width + width * 0.1).toFixed(1), y: base.toFixed(1),
          width: Math.max(1, width * 0.8).toFixed(1), height: h.toFixed(1),
          fill: group === "others" ? USAGE_COLORS[USAGE_COLORS.length - 1] : colorOf(group),
          "data-group": group }));
      }
    });
    desc.textContent = `${fmt(totals.reduce((a, b) => a + b, 0))} tokens in the range, at most ${fmt(max)} in one ` +
      `${bucket}`;
  }
  box.replaceChildren(root);
  box.dataset.bars = String(totals.filter((t) => t > 0).length);
  $("usage-legend").replaceChildren(...[...shown, ...(ranked.length > shown.length ? ["others"] : [])].map((g) => {
    const swatch = el("span", { class: "swatch" });
    // through the CSSOM: the page's Content-Security-Policy allows no inline style attribute
    swatch.style.backgroundColor = g === "others" ? USAGE_COLORS[USAGE_COLORS.length - 1] : colorOf(g);
    return el("li", {}, swatch, g);
  }));
}

// Operators: one row per tenant (all its models), with the estimated cost. A tenant: one row per model and lane.
function renderUsageTable(rows, everyTenant) {
  const groups = new Map();
  for (const r of rows) {
    const key = everyTenant ? r.tenant : `${r.model}\u0000${r.lane}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(r);
  }
  const all = usageTotals(rows);
  $("usage-first").textContent = everyTenant ? "Tenant" : "Model (lane)";
  document.querySelectorAll("#usage-table .cost").forEach((cell) => { cell.hidden = !all.priced; });
  const line = (name, t, attrs = {}) => el("tr", attrs,
    el("th", { scope: "row" }, name),
    el("td", {}, fmt(t.succeeded)), el("td", {}, fmt(t.failed + t.cancelled + t.expired)),
    el("td", {}, fmt(t.prompt)), el("td", {}, fmt(t.completion)),
    el("td", {}, gpuTime(t.gpu)),
    all.priced ? el("td", { class: "cost" }, dollars(t.usd)) : null,
    all.priced ? el("td", { class: "cost" }, t.tokens ? dollars((t.usd / t.tokens) * 1e6) : "–") : null);
  const body = [...groups.entries()]
    .map(([key, group]) => [key, usageTotals(group)])
    .sort((a, b) => b[1].tokens - a[1].tokens)
    .map(([key, t]) => line(everyTenant ? key : key.replace("\u0000", " (") + ")", t,
      { "data-row": everyTenant ? key : key.split("\u0000")[0] }));
  $("usage-table").tBodies[0].replaceChildren(...body);
  $("usage-table").tFoot.replaceChildren(...(rows.length ? [line("Total", all, { class: "total" })] : []));
  $("usage-empty").hidden = rows.length > 0;
}

const USAGE_EVERY_MS = 60000;

document.addEventListener("DOMContentLoaded", () => {
  $("usage-range").addEventListener("change", refreshUsage);
  $("usage-refresh").addEventListener("click", refreshUsage);
  setInterval(() => { if (!document.hidden && apiKey() && state.view === "usage") refreshUsage(); }, USAGE_EVERY_MS);
});
