// inferq console: plain JS, no build step. Every call goes to the public API with the key typed into the page;
// the key lives in sessionStorage (this tab only). Nothing here writes untrusted text as HTML.
"use strict";

const API = new URL("../", location.href); // the gateway's root, also under an API Gateway stage prefix
const KEY = "inferq.apiKey";
const RECENT = "inferq.recentJobs";
const TERMINAL = new Set(["succeeded", "failed", "cancelled", "expired"]);
const HOUR_S = 3600;
const SCALE_EVERY_MS = 3000;
const HISTORY_EVERY_MS = 10000;
const DLQ_PAGE = 25;
const DLQ_MAX = 1000;
const RECENT_MAX = 20;
const BATCHES_PAGE = 20;
const BATCHES_EVERY_MS = 2000;
const BATCH_ENDED = new Set(["completed", "failed", "expired", "cancelled"]);

const $ = (id) => document.getElementById(id);
const state = {
  view: "overview", job: null, jobPoll: null, dlqLimit: DLQ_PAGE, timers: [],
  batchPages: [null], batchesRunning: false, // `after` of each page shown so far (null: the newest)
};

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "onclick") node.addEventListener("click", value);
    else if (value !== null && value !== undefined && value !== false) node.setAttribute(name, value);
  }
  for (const child of children.flat(Infinity)) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function notice(text, error = false) {
  const box = $("notice");
  box.textContent = text;
  box.classList.toggle("error", error);
}

// ------------------------------------------------------------------ the API

class ApiError extends Error {
  constructor(status, type, message) {
    super(`${status} ${type}: ${message}`);
    this.status = status;
    this.type = type;
  }
}

function apiKey() {
  return sessionStorage.getItem(KEY) || "";
}

async function api(method, path, { signal } = {}) {
  const key = apiKey();
  if (!key) throw new ApiError(401, "unauthorized", "enter an API key first");
  let response;
  try {
    response = await fetch(new URL(path, API), {
      method, signal, headers: { Authorization: `Bearer ${key}` }, cache: "no-store",
    });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, "unreachable", "the gateway does not answer");
  }
  let body = null;
  try { body = await response.json(); } catch { body = null; }
  if (!response.ok) {
    const error = (body && body.error) || {};
    const failure = new ApiError(response.status, error.type || "error", error.message || response.statusText);
    failure.body = body;
    if (response.status === 401) keyRefused();
    throw failure;
  }
  return body;
}

function keyRefused() {
  sessionStorage.removeItem(KEY);
  showKeyState();
  notice("The gateway refused this API key. Enter another one.", true);
}

// ------------------------------------------------------------------ views

function showView(name) {
  if (apiKey()) notice("");
  state.view = ["overview", "jobs", "dlq", "batches", "usage"].includes(name) ? name : "overview";
  for (const section of document.querySelectorAll(".view")) {
    section.hidden = section.id !== `view-${state.view}`;
  }
  for (const link of document.querySelectorAll("nav a[data-view]")) {
    if (link.dataset.view === state.view) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  refreshView();
}

function refreshView() {
  if (!apiKey()) return;
  if (state.view === "overview") { refreshScale(); refreshHistory(); }
  if (state.view === "dlq") refreshDlq();
  if (state.view === "jobs") renderRecent();
  if (state.view === "batches") refreshBatches();
  if (state.view === "usage") refreshUsage(); // usage.js
}

function showKeyState() {
  const connected = Boolean(apiKey());
  $("forget").hidden = !connected;
  $("connect").textContent = connected ? "Change key" : "Connect";
  document.body.dataset.connected = connected ? "yes" : "no";
}

// ------------------------------------------------------------------ overview: gauges and charts

const fmt = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"));

async function refreshScale() {
  try {
    const scale = await api("GET", "v1/scale?by_tenant=true");
    for (const name of ["lag", "pending", "unfinished", "dlq", "workers", "desired"]) {
      $(`g-${name}`).textContent = fmt(scale[name]);
    }
    const decision = scale.decision || {};
    $("g-decision").textContent = decision.reason
      ? `${decision.reason} (${ago(decision.at)})` : "none yet";
    renderWaiting(scale.waiting || {});
    $("updated").textContent = `Updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    if (err.status === 403) {  // not an operator key: queue-wide numbers are not this tenant's to see
      for (const name of ["lag", "pending", "unfinished", "dlq", "workers", "desired"]) $(`g-${name}`).textContent = "–";
      $("g-decision").textContent = "operator keys only";
      renderWaiting({});
    } else if (err.status !== 401) notice(`Queue view unavailable: ${err.message}`, true);
  }
}

// Each tenant's jobs waiting for their turn (fair share), most first; tenant names only as text.
function renderWaiting(waiting) {
  const total = (lanes) => Object.values(lanes).reduce((a, b) => a + b, 0);
  const rows = Object.entries(waiting).sort((a, b) => total(b[1]) - total(a[1])).map(([tenant, lanes]) => {
    const row = document.createElement("tr");
    for (const text of [tenant, fmt(lanes.high || 0), fmt(lanes.normal || 0), fmt(lanes.low || 0)]) {
      const cell = document.createElement("td");
      cell.textContent = text;
      row.append(cell);
    }
    return row;
  });
  $("waiting-rows").replaceChildren(...rows);
  $("waiting-table").hidden = rows.length === 0;
}

async function refreshHistory() {
  try {
    const history = await api("GET", "v1/stats/history");
    const samples = history.data || [];
    const newest = samples[samples.length - 1];
    $("g-delayed").textContent = newest ? fmt(newest.delayed) : "–";
    const now = Date.now() / 1000;
    // The x axis spans the last hour, or less while the history is younger: a new queue's first minutes show.
    const start = Math.max(now - HOUR_S, samples.length ? Math.min(samples[0].at, now - 60) : now - HOUR_S);
    const series = rates(samples, start);
    const span = { start, now };
    drawChart($("chart-throughput"), series.throughput, "tp-title", span, (v) => v.toFixed(v < 10 ? 1 : 0));
    drawChart($("chart-latency"), series.latency, "lat-title", span, (v) => `${v.toFixed(v < 10 ? 2 : 0)} s`);
  } catch (err) {
    if (err.status !== 401 && err.status !== 403) notice(`History unavailable: ${err.message}`, true);
  }
}

const ENDED = ["succeeded", "failed", "cancelled", "expired"];

// Rates between consecutive samples. A counter that went down (a reset) or a repeated sample gives no point.
function rates(samples, since) {
  const throughput = [];
  const latency = [];
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1];
    const b = samples[i];
    const dt = b.at - a.at;
    if (b.at < since || dt <= 0) continue;
    const ended = ENDED.reduce((sum, k) => sum + ((b[k] || 0) - (a[k] || 0)), 0);
    if (ended < 0) continue;
    throughput.push([b.at, (ended * 60) / dt]);
    if (ended > 0 && "latency_ms_total" in a && "latency_ms_total" in b) {
      const total = b.latency_ms_total - a.latency_ms_total;
      if (total >= 0) latency.push([b.at, total / ended / 1000]);
    }
  }
  return { throughput, latency };
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  if (text !== null) node.textContent = text;
  return node;
}

function drawChart(box, points, titleId, span, label) {
  const W = 600, H = 180, L = 48, R = 10, T = 10, B = 24;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-labelledby": titleId });
  const width = Math.max(1, span.now - span.start);
  const x = (t) => L + ((t - span.start) / width) * (W - L - R);
  root.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  root.append(svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  root.append(svg("line", { class: "axis grid", x1: L, y1: (T + H - B) / 2, x2: W - R, y2: (T + H - B) / 2 }));
  root.append(svg("text", { x: L, y: H - 6 }, `−${Math.max(1, Math.round(width / 60))} min`));
  root.append(svg("text", { x: W - R, y: H - 6, "text-anchor": "end" }, "now"));
  const summary = svg("desc");
  root.append(summary);
  if (!points.length) {
    root.append(svg("text", { class: "empty", x: (W + L) / 2, y: H / 2, "text-anchor": "middle" }, "no data"));
    summary.textContent = "no data";
    box.replaceChildren(root);
    box.dataset.points = "0";
    return;
  }
  const max = Math.max(...points.map((p) => p[1]), 1e-9);
  const top = niceCeil(max);
  const y = (v) => H - B - (v / top) * (H - B - T);
  root.append(svg("text", { x: L - 6, y: T + 8, "text-anchor": "end" }, label(top)));
  root.append(svg("text", { x: L - 6, y: H - B, "text-anchor": "end" }, "0"));
  const coords = points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`);
  const first = x(points[0][0]).toFixed(1);
  const last = x(points[points.length - 1][0]).toFixed(1);
  root.append(svg("path", { class: "area", d: `M${first},${H - B} L${coords.join(" L")} L${last},${H - B} Z` }));
  root.append(svg("polyline", { class: "line", points: coords.join(" ") }));
  const latest = points[points.length - 1][1];
  summary.textContent = `latest ${label(latest)}, peak ${label(max)}`;
  box.replaceChildren(root);
  box.dataset.points = String(points.length);
}

function niceCeil(v) {
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function ago(at) {
  if (!at) return "";
  const s = Math.max(0, Date.now() / 1000 - at);
  return s < 90 ? `${Math.round(s)} s ago` : `${Math.round(s / 60)} min ago`;
}

// ------------------------------------------------------------------ jobs

const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "–");
const span = (a, b) => (a && b ? `${(b - a).toFixed(2)} s` : "–");

function rememberJob(id) {
  const ids = JSON.parse(sessionStorage.getItem(RECENT) || "[]").filter((x) => x !== id);
  ids.unshift(id);
  sessionStorage.setItem(RECENT, JSON.stringify(ids.slice(0, RECENT_MAX)));
}

function renderRecent() {
  const ids = JSON.parse(sessionStorage.getItem(RECENT) || "[]");
  $("recent").replaceChildren(...(ids.length
    ? ids.map((id) => el("li", {}, el("button", { type: "button", class: "link", onclick: () => openJob(id) }, id)))
    : [el("li", { class: "help" }, "None yet: look a job up by its id.")]));
}

async function openJob(id) {
  id = id.trim();
  if (state.view !== "jobs") { location.hash = "#jobs"; }
  $("job-id").value = id;
  if (state.jobPoll) state.jobPoll.abort();
  state.job = id;
  const box = $("job");
  try {
    const job = await api("GET", `v1/jobs/${encodeURIComponent(id)}`);
    rememberJob(id);
    renderRecent();
    renderJob(job);
    follow(job);
  } catch (err) {
    if (err.name === "AbortError") return;
    box.hidden = false;
    box.dataset.status = "missing";
    box.replaceChildren(el("h2", {}, id), el("p", { class: "error" },
      err.status === 404 ? "No such job for this API key." : `Lookup failed: ${err.message}`));
  }
}

// Long-poll while the job is shown and not terminal: the page sees it end without a polling loop of its own.
async function follow(job) {
  if (TERMINAL.has(job.status)) return;
  const control = new AbortController();
  state.jobPoll = control;
  let current = job;
  while (!TERMINAL.has(current.status) && state.job === current.id && !control.signal.aborted) {
    try {
      current = await api("GET", `v1/jobs/${encodeURIComponent(current.id)}?wait=20`, { signal: control.signal });
      if (state.job === current.id) renderJob(current);
    } catch (err) {
      if (err.name === "AbortError" || err.status === 401 || err.status === 404) return;
      await new Promise((done) => setTimeout(done, 2000));
    }
  }
}

function renderJob(job) {
  const box = $("job");
  box.hidden = false;
  box.dataset.status = job.status;
  const actions = el("div", { class: "row" });
  if (!TERMINAL.has(job.status)) {
    actions.append(el("button", { type: "button", class: "danger", id: "cancel-job",
      onclick: () => act("POST", `v1/jobs/${job.id}/cancel`, "Cancel requested") }, "Cancel job"));
  }
  if (job.dead_lettered) {
    actions.append(el("button", { type: "button", id: "redrive-job",
      onclick: () => act("POST", `v1/dlq/${job.id}/redrive`, "Queued again") }, "Redrive"));
  }
  const rows = [
    ["Status", el("span", { class: `badge s-${job.status}`, id: "job-status" }, job.status)],
    ["Endpoint", job.url],
    ["Attempts", String(job.attempts)],
    ["Created", when(job.created_at)],
    ["Started", when(job.started_at)],
    ["Finished", when(job.finished_at)],
    ["Waited in queue", span(job.created_at, job.started_at)],
    ["Ran for", span(job.started_at, job.finished_at)],
    ["Queue to done", span(job.created_at, job.finished_at)],
    ["Dead-lettered", job.dead_lettered ? "yes" : "no"],
  ];
  if (job.error) rows.push(["Error", `${job.error.type}: ${job.error.message}`]);
  if (job.metadata && Object.keys(job.metadata).length) rows.push(["Metadata", JSON.stringify(job.metadata)]);
  const parts = [
    el("h2", {}, job.id),
    el("dl", {}, rows.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
    actions,
  ];
  if (job.result) parts.push(el("h3", {}, "Result"), el("pre", { tabindex: "0" }, JSON.stringify(job.result, null, 2)));
  box.replaceChildren(...parts);
}

async function act(method, path, done) {
  try {
    const job = await api(method, path);
    await openJob(job.id);
    notice(`${done}: ${job.id} is ${job.status}`);
  } catch (err) {
    const job = err.body && err.body.job;
    notice(`${err.message}`, true);
    if (job) renderJob(job);
  }
}

// ------------------------------------------------------------------ dead letters

async function refreshDlq() {
  try {
    const list = await api("GET", `v1/dlq?limit=${state.dlqLimit}`);
    const jobs = list.data || [];
    const rows = jobs.map((job) => el("tr", { "data-job": job.id },
      el("td", { class: "id" }, el("button", { type: "button", class: "link", onclick: () => openJob(job.id) }, job.id)),
      el("td", {}, job.error ? `${job.error.type}: ${job.error.message}` : "–"),
      el("td", {}, String(job.attempts)),
      el("td", {}, when(job.finished_at)),
      el("td", {}, el("button", { type: "button", "aria-label": `Redrive ${job.id}`,
        onclick: () => redrive(job.id) }, "Redrive"))));
    $("dlq-table").tBodies[0].replaceChildren(...rows);
    $("dlq-empty").hidden = jobs.length > 0;
    $("dlq-more").hidden = jobs.length < state.dlqLimit || state.dlqLimit >= DLQ_MAX;
  } catch (err) {
    if (err.status !== 401) notice(`Dead letters unavailable: ${err.message}`, true);
  }
}

async function redrive(id) {
  try {
    const job = await api("POST", `v1/dlq/${encodeURIComponent(id)}/redrive`);
    await openJob(job.id); // first: switching views clears the notice
    notice(`Queued again: ${job.id} is ${job.status}`);
  } catch (err) {
    notice(`Redrive failed: ${err.message}`, true);
    refreshDlq();
  }
}

// ------------------------------------------------------------------ batches

// GET /v1/batches pages newest first with `after` (the last id of the page before): one page at a time, so a
// tenant with thousands of batches costs one short read.
async function refreshBatches() {
  const after = state.batchPages[state.batchPages.length - 1];
  const query = `v1/batches?limit=${BATCHES_PAGE}${after ? `&after=${encodeURIComponent(after)}` : ""}`;
  try {
    const list = await api("GET", query);
    const batches = list.data || [];
    $("batches-table").tBodies[0].replaceChildren(...batches.map(batchRow));
    $("batches-empty").hidden = batches.length > 0;
    $("batches-older").hidden = !list.has_more;
    $("batches-older").dataset.after = list.last_id || "";
    $("batches-newer").hidden = state.batchPages.length < 2;
    state.batchesRunning = batches.some((b) => !BATCH_ENDED.has(b.status));
  } catch (err) {
    if (err.status !== 401) notice(`Batches unavailable: ${err.message}`, true);
  }
}

function batchRow(batch) {
  const counts = batch.request_counts || { total: 0, completed: 0, failed: 0 };
  const ended = counts.completed + counts.failed;
  // a batch cancelled while validating ends its lines without ever having counted them
  const total = Math.max(counts.total, ended);
  // no value while the total is unknown (validating): an indeterminate bar, not an empty one
  const known = total > 0 || BATCH_ENDED.has(batch.status);
  const bar = el("progress", { max: Math.max(1, total), value: known ? ended : null,
    "aria-label": `Lines ended of ${batch.id}` });
  const progress = el("div", { class: "progress" }, bar,
    el("span", { class: "count" }, total ? `${fmt(ended)} / ${fmt(total)}` : "–"),
    counts.failed ? el("span", { class: "bad" }, `${fmt(counts.failed)} failed`) : null);
  const errors = (batch.errors && batch.errors.data) || [];
  const status = [el("span", { class: `badge s-${batch.status}` }, batch.status.replace("_", " "))];
  if (errors.length) status.push(el("div", { class: "help" }, `line ${errors[0].line}: ${errors[0].message}`));
  const endedAt = batch.completed_at || batch.failed_at || batch.cancelled_at || batch.expired_at;
  const cancellable = ["validating", "in_progress", "finalizing"].includes(batch.status);
  return el("tr", { "data-batch": batch.id, "data-status": batch.status },
    el("td", { class: "id" }, batch.id),
    el("td", {}, status),
    el("td", {}, progress),
    el("td", {}, when(batch.created_at)),
    el("td", {}, when(batch.in_progress_at)),
    el("td", {}, when(endedAt)),
    el("td", {}, cancellable ? el("button", { type: "button", class: "danger", "aria-label": `Cancel ${batch.id}`,
      onclick: () => cancelBatch(batch.id) }, "Cancel") : null));
}

async function cancelBatch(id) {
  try {
    const batch = await api("POST", `v1/batches/${encodeURIComponent(id)}/cancel`);
    notice(`Cancel requested: ${batch.id} is ${batch.status.replace("_", " ")}`);
  } catch (err) {
    notice(`Cancel failed: ${err.message}`, true);
  }
  refreshBatches();
}

// ------------------------------------------------------------------ wiring

function route() {
  const [view, id] = location.hash.replace(/^#/, "").split("/");
  showView(view || "overview");
  if (view === "jobs" && id && id !== state.job) openJob(decodeURIComponent(id));
}

function every(ms, fn) {
  state.timers.push(setInterval(() => { if (!document.hidden && apiKey()) fn(); }, ms));
}

document.addEventListener("DOMContentLoaded", () => {
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (!key) { notice("Type an API key first.", true); $("api-key").focus(); return; }
    sessionStorage.setItem(KEY, key);
    $("api-key").value = "";
    showKeyState();
    notice("Connected.");
    refreshView();
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    sessionStorage.removeItem(RECENT);
    showKeyState();
    notice("Key forgotten.");
  });
  $("lookup-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const id = $("job-id").value.trim();
    if (id) openJob(id);
  });
  $("dlq-refresh").addEventListener("click", refreshDlq);
  $("dlq-more").addEventListener("click", () => {
    state.dlqLimit = Math.min(DLQ_MAX, state.dlqLimit + DLQ_PAGE);
    refreshDlq();
  });
  $("batches-refresh").addEventListener("click", refreshBatches);
  $("batches-older").addEventListener("click", () => {
    state.batchPages.push($("batches-older").dataset.after);
    refreshBatches();
  });
  $("batches-newer").addEventListener("click", () => {
    if (state.batchPages.length > 1) state.batchPages.pop();
    refreshBatches();
  });
  window.addEventListener("hashchange", route);
  every(SCALE_EVERY_MS, () => state.view === "overview" && refreshScale());
  every(HISTORY_EVERY_MS, () => state.view === "overview" && refreshHistory());
  every(BATCHES_EVERY_MS, () => state.view === "batches" && state.batchesRunning && refreshBatches());
  showKeyState();
  if (!apiKey()) notice("Enter an API key to see your queue and your jobs.");
  route();
});
