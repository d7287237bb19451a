"""The live dashboard: one static HTML page with inline JS and canvas charts (no build step, no CDN).

It polls ``GET /v1/stats`` once a second and draws: the headline figures (ingest rate, accepted, rejected,
drops, refusals, store latency), a heat strip of per-partition buffer usage for every queue, per-drain-thread
load over time for L1 and L2 with rebalance events marked, ingest / drop rates over time, and the latest
minute's metrics for the busiest services (from the store), and the alerts: those firing and the latest
notifications with their delivery (``serve``), or the Kafka partitions held with their lag (``consume``). A service name opens its drill-down view, ``/#service=NAME&range=minute|hour|day``:
its charts over the range (cpm, p50/p90/p99, SLA, apdex, errors), endpoints and instances ranked, its slowest
statements and, with exemplars, its slowest traced requests linked to their traces (``GET /v1/service``,
:mod:`.drilldown`). A token in the URL (``/#token=...``) is sent as a bearer token.
"""

from __future__ import annotations

PAGE_TEXT = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>drainpipe · live</title>
<style>
  :root { --bg:#0f1419; --panel:#171e26; --line:#263140; --fg:#d8dee6; --dim:#8593a3; --accent:#5cc8ff;
          --good:#4fd18b; --warn:#ffb547; --bad:#ff5d5d; }
  * { box-sizing: border-box; }
  body { margin:0; background:var(--bg); color:var(--fg); font:14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; }
  header { display:flex; align-items:baseline; gap:16px; padding:12px 20px; border-bottom:1px solid var(--line); }
  header h1 { font-size:18px; margin:0; letter-spacing:.5px; }
  header .dim { color:var(--dim); }
  #status { padding:2px 8px; border-radius:10px; font-size:12px; background:var(--line); }
  #status.ok { background:#1d4030; color:var(--good); } #status.bad { background:#4a1f22; color:var(--bad); }
  #status.warn { background:#4a3a1a; color:var(--warn); }
  main { display:grid; grid-template-columns: repeat(12, 1fr); gap:12px; padding:12px 20px 20px; }
  .panel { background:var(--panel); border:1px solid var(--line); border-radius:8px; padding:10px 12px; min-width:0; }
  .panel h2 { margin:0 0 8px; font-size:12px; font-weight:600; color:var(--dim); text-transform:uppercase; letter-spacing:.8px; }
  .kpis { grid-column: span 12; display:grid; grid-template-columns: repeat(7, 1fr); gap:12px; background:none; border:none; padding:0; }
  .kpi { background:var(--panel); border:1px solid var(--line); border-radius:8px; padding:10px 12px; }
  .kpi .v { font-size:24px; font-variant-numeric: tabular-nums; font-weight:600; }
  .kpi .l { color:var(--dim); font-size:12px; }
  .wide { grid-column: span 12; } .half { grid-column: span 6; } .third { grid-column: span 4; } .twothirds { grid-column: span 8; }
  .heatrow { display:flex; align-items:center; gap:8px; margin:4px 0; }
  .heatrow .name { width:120px; color:var(--dim); font-size:12px; white-space:nowrap; overflow:hidden; text-overflow:ellipsis; }
  .heatrow .meta { width:150px; color:var(--dim); font-size:12px; text-align:right; font-variant-numeric: tabular-nums; }
  .strip { flex:1; display:flex; gap:1px; height:18px; }
  .cell { flex:1; min-width:2px; border-radius:2px; }
  canvas { width:100%; height:190px; display:block; }
  table { width:100%; border-collapse:collapse; font-variant-numeric: tabular-nums; }
  th, td { padding:4px 6px; text-align:right; border-bottom:1px solid var(--line); white-space:nowrap; }
  th:first-child, td:first-child { text-align:left; }
  th { color:var(--dim); font-weight:500; font-size:12px; }
  .legend { color:var(--dim); font-size:12px; margin-top:4px; }
  .legend span { display:inline-block; margin-right:10px; }
  .swatch { display:inline-block; width:10px; height:10px; border-radius:2px; margin-right:4px; vertical-align:-1px; }
  #rebalances div { font-size:12px; color:var(--dim); font-variant-numeric: tabular-nums; }
  #error { color:var(--bad); }
  .bad { color:var(--bad); } .good { color:var(--good); } .warn { color:var(--warn); }
  [hidden] { display:none !important; }  /* main is a grid: without this the hidden view would still show */
  a { color:var(--accent); text-decoration:none; } a:hover { text-decoration:underline; }
  #alerts div { font-size:13px; margin:2px 0; font-variant-numeric: tabular-nums; }
</style>
</head>
<body>
<header>
  <h1>drainpipe</h1><span id="status">connecting…</span>
  <span class="dim">up <span id="uptime">–</span></span>
  <span class="dim">store <span id="store-url">–</span></span>
  <span class="dim">updated <span id="updated">–</span> (<span id="polls">0</span> polls)</span>
  <span id="error"></span>
</header>
<main id="live">
  <section class="kpis">
    <div class="kpi"><div class="v" id="events-rate">–</div><div class="l">events/s ingested</div></div>
    <div class="kpi"><div class="v" id="accepted-total">–</div><div class="l">events accepted</div></div>
    <div class="kpi"><div class="v" id="rejected-total">–</div><div class="l">events rejected (invalid)</div></div>
    <div class="kpi"><div class="v" id="dropped-total">–</div><div class="l">items dropped (queues full)</div></div>
    <div class="kpi"><div class="v" id="refused-total">–</div><div class="l">requests refused (429/503)</div></div>
    <div class="kpi"><div class="v" id="store-latency">–</div><div class="l">store write p50 / p99 ms</div></div>
    <div class="kpi"><div class="v" id="rebalance-total">–</div><div class="l">rebalances (L1 + L2)</div></div>
  </section>
  <section class="panel wide"><h2>Partition buffer usage (each cell one partition; green empty → red full)</h2>
    <div id="heat"></div></section>
  <section class="panel half"><h2>L1 drain threads: items/s per thread, ▼ = rebalance</h2>
    <canvas id="load-l1"></canvas><div class="legend" id="legend-l1"></div></section>
  <section class="panel half"><h2>L2 drain threads: items/s per thread, ▼ = rebalance</h2>
    <canvas id="load-l2"></canvas><div class="legend" id="legend-l2"></div></section>
  <section class="panel twothirds"><h2>Ingest: events/s accepted, drops/s, refused requests/s</h2>
    <canvas id="rate-chart"></canvas>
    <div class="legend"><span><i class="swatch" style="background:#5cc8ff"></i>events/s</span>
      <span><i class="swatch" style="background:#ff5d5d"></i>drops/s</span>
      <span><i class="swatch" style="background:#ffb547"></i>refused/s</span></div></section>
  <section class="panel third"><h2>Recent rebalances</h2><div id="rebalances"></div>
    <h2>Slow handler calls (over slow_handler_ms)</h2><div id="slow-calls"></div></section>
  <section class="panel wide"><h2>Busiest services · latest minute in the store <span id="top-bucket" class="dim"></span></h2>
    <table id="top-services"><thead></thead><tbody></tbody></table></section>
  <section class="panel wide" id="kafka" hidden><h2>Kafka partitions held <span id="kafka-summary" class="dim"></span></h2>
    <table id="kafka-partitions"><thead></thead><tbody></tbody></table></section>
  <section class="panel wide" id="alerts"><h2>Alerts <span id="alert-summary" class="dim"></span></h2>
    <div id="alerts-firing"></div><div id="alerts-recent"></div></section>
</main>
<main id="drill" hidden>
  <section class="panel wide"><h2><a href="#" id="back">← live view</a> · service <span id="drill-service"></span> ·
    <span id="drill-range"></span> <span id="drill-window" class="dim"></span></h2><div id="drill-error" class="bad"></div></section>
  <section class="panel half"><h2>Calls per minute <span id="latest-cpm" class="dim"></span></h2><canvas id="chart-cpm"></canvas></section>
  <section class="panel half"><h2>Latency p50 / p90 / p99 <span id="latest-latency" class="dim"></span></h2><canvas id="chart-latency"></canvas>
    <div class="legend"><span><i class="swatch" style="background:#4fd18b"></i>p50</span><span><i class="swatch" style="background:#ffb547"></i>p90</span><span><i class="swatch" style="background:#ff5d5d"></i>p99</span></div></section>
  <section class="panel third"><h2>SLA <span id="latest-sla" class="dim"></span></h2><canvas id="chart-sla"></canvas></section>
  <section class="panel third"><h2>Apdex <span id="latest-apdex" class="dim"></span></h2><canvas id="chart-apdex"></canvas></section>
  <section class="panel third"><h2>Errors <span id="latest-errors" class="dim"></span></h2><canvas id="chart-errors"></canvas></section>
  <section class="panel half"><h2>Endpoints, by calls in the range</h2><table id="drill-endpoints"><thead></thead><tbody></tbody></table></section>
  <section class="panel half"><h2>Instances, by calls in the range</h2><table id="drill-instances"><thead></thead><tbody></tbody></table></section>
  <section class="panel wide"><h2>Slowest statements in the range</h2><table id="drill-statements"><thead></thead><tbody></tbody></table></section>
  <section class="panel wide" id="drill-traces-panel" hidden><h2>Slowest traced requests, last hour of the range</h2><table id="drill-traces"><thead></thead><tbody></tbody></table></section>
</main>
<script>
"use strict";
const COLORS = ["#5cc8ff","#4fd18b","#ffb547","#c792ea","#ff7eb6","#7ee0d0","#f78c6c","#82aaff","#c3e88d","#ffcb6b"];
const token = (location.hash.match(/token=([^&]+)/) || [])[1];
const headers = token ? {"Authorization": "Bearer " + decodeURIComponent(token)} : {};
let polls = 0;
const $ = (id) => document.getElementById(id);
const fmt = (n) => n == null ? "–" : Math.abs(n) >= 1e6 ? (n / 1e6).toFixed(2) + "M" : Math.abs(n) >= 1e4 ? (n / 1e3).toFixed(1) + "k" : (Math.round(n * 10) / 10).toLocaleString();
const fmtInt = (n) => n == null ? "–" : Number(n).toLocaleString();
// text from the data (service and entity names come from the events) is escaped before it goes into markup
const esc = (v) => String(v).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);
function dur(s) { s = Math.floor(s); const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60); return (h ? h + "h " : "") + (h || m ? m + "m " : "") + (s % 60) + "s"; }
function heatColor(pct) { const u = Math.max(0, Math.min(1, pct / 100)); const hue = 140 - 140 * u; return `hsl(${hue}, ${40 + 40 * u}%, ${22 + 28 * Math.sqrt(u)}%)`; }

function renderHeat(queues) {
  const box = $("heat");
  for (const q of queues) {
    let row = document.getElementById("heat-" + q.role);
    if (!row) {
      row = document.createElement("div"); row.className = "heatrow"; row.id = "heat-" + q.role;
      row.innerHTML = `<div class="name"></div><div class="strip"></div><div class="meta"></div>`;
      box.appendChild(row);
    }
    row.querySelector(".name").textContent = q.name;
    const strip = row.querySelector(".strip");
    while (strip.children.length < q.partitions.length) { const c = document.createElement("div"); c.className = "cell"; strip.appendChild(c); }
    while (strip.children.length > q.partitions.length) strip.removeChild(strip.lastChild);
    q.partitions.forEach((pct, i) => { const c = strip.children[i]; c.style.background = heatColor(pct); c.title = `partition ${i}: ${pct}%`; });
    row.querySelector(".meta").textContent = `${q.partitions.length} parts · ${q.used_pct.toFixed(1)}% · ${q.tasks.length} thr`;
  }
}

function setupCanvas(cv) {
  const dpr = window.devicePixelRatio || 1, w = cv.clientWidth, h = cv.clientHeight;
  if (cv.width !== Math.round(w * dpr) || cv.height !== Math.round(h * dpr)) { cv.width = Math.round(w * dpr); cv.height = Math.round(h * dpr); }
  const ctx = cv.getContext("2d"); ctx.setTransform(dpr, 0, 0, dpr, 0, 0); ctx.clearRect(0, 0, w, h);
  return [ctx, w, h];
}

function drawSeries(cv, t0, t1, series, markers, labels) {
  const [ctx, w, h] = setupCanvas(cv);
  const L = 46, R = 8, T = 10, B = 20, pw = w - L - R, ph = h - T - B;
  let ymax = 1; for (const s of series) for (const p of s.points) if (p[1] != null) ymax = Math.max(ymax, p[1]);
  ymax *= 1.1;
  const x = (t) => L + (t1 > t0 ? (t - t0) / (t1 - t0) : 1) * pw, y = (v) => T + ph - v / ymax * ph;
  ctx.strokeStyle = "#263140"; ctx.fillStyle = "#8593a3"; ctx.font = "11px system-ui"; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) { const v = ymax * i / 4, yy = y(v); ctx.beginPath(); ctx.moveTo(L, yy); ctx.lineTo(w - R, yy); ctx.stroke(); ctx.fillText(fmt(v), 2, yy + 4); }
  const [left, right] = labels || [`−${Math.round(t1 - t0)} s`, "now"];
  ctx.fillText(left, L, h - 5); ctx.fillText(right, w - R - ctx.measureText(right).width, h - 5);
  for (const m of markers || []) {
    if (m.t < t0) continue; const xx = x(m.t);
    ctx.strokeStyle = "rgba(255,181,71,.7)"; ctx.setLineDash([3, 3]); ctx.beginPath(); ctx.moveTo(xx, T); ctx.lineTo(xx, T + ph); ctx.stroke(); ctx.setLineDash([]);
    ctx.fillStyle = "#ffb547"; ctx.beginPath(); ctx.moveTo(xx - 5, T); ctx.lineTo(xx + 5, T); ctx.lineTo(xx, T + 8); ctx.fill();
  }
  for (const s of series) {
    if (!s.points.length) continue;
    ctx.strokeStyle = s.color; ctx.lineWidth = 1.6; ctx.beginPath();
    let pen = false;  // a null value (no data in that bucket) lifts the pen
    for (const p of s.points) { if (p[1] == null) { pen = false; continue; } pen ? ctx.lineTo(x(p[0]), y(p[1])) : ctx.moveTo(x(p[0]), y(p[1])); pen = true; }
    ctx.fillStyle = s.color;
    for (const p of s.points) if (p[1] != null && s.points.length < 80) ctx.fillRect(x(p[0]) - 1.5, y(p[1]) - 1.5, 3, 3);
    ctx.stroke();
  }
}

function renderLoad(role, data) {
  const q = data.queues.find((q) => q.role === role); if (!q) return;
  const hist = data.history, t1 = data.now, t0 = hist.length ? Math.min(hist[0].t, t1 - 10) : t1 - 60;
  const n = q.tasks.length, series = [];
  for (let k = 0; k < n; k++) series.push({color: COLORS[k % COLORS.length], points: hist.filter((p) => p.task_load && p.task_load[q.name]).map((p) => [p.t, p.task_load[q.name][k] || 0])});
  const markers = data.rebalances.filter((r) => r.queue === q.name).map((r) => ({t: r.at}));
  drawSeries($("load-" + role.toLowerCase()), t0, t1, series, markers);
  $("legend-" + role.toLowerCase()).innerHTML = q.tasks.map((d, k) => `<span><i class="swatch" style="background:${COLORS[k % COLORS.length]}"></i>thread ${k}: ${fmt(q.task_load[k] || 0)}/s · ${q.task_partitions[k]} parts</span>`).join("") + `<span>${q.rebalances} rebalances</span>`;
}

function renderRates(data) {
  const hist = data.history, t1 = data.now, t0 = hist.length ? Math.min(hist[0].t, t1 - 10) : t1 - 60;
  drawSeries($("rate-chart"), t0, t1, [
    {color: "#5cc8ff", points: hist.map((p) => [p.t, p.events_per_s || 0])},
    {color: "#ff5d5d", points: hist.map((p) => [p.t, p.drops_per_s || 0])},
    {color: "#ffb547", points: hist.map((p) => [p.t, p.refused_per_s || 0])}], []);
}

// a metric value at the precision and in the unit its column declares (data-decimals, data-unit on the <th>)
const fmtMetric = (v, f) => v == null ? "–" : Number(v).toLocaleString("en-US", {minimumFractionDigits: f.decimals, maximumFractionDigits: f.decimals}) + f.unit;

function renderTop(top) {
  const table = $("top-services");
  $("top-bucket").textContent = top.bucket ? "(" + top.bucket + ")" : "(no data yet)";
  const formats = top.formats || [];
  table.tHead.innerHTML = "<tr>" + top.columns.map((c, i) => formats[i] ? `<th data-decimals="${formats[i].decimals}" data-unit="${formats[i].unit}">${c}</th>` : `<th>${c}</th>`).join("") + "</tr>";
  table.tBodies[0].innerHTML = top.rows.map((r) => "<tr>" + r.map((v, i) => `<td>${i === 0 ? `<a class="svc" href="${link({service: v, range: "minute"})}">${esc(v)}</a>` : i === 1 ? esc(String(v).slice(11, 16)) : fmtMetric(v, formats[i] || {decimals: 1, unit: ""})}</td>`).join("") + "</tr>").join("");
}

// ---- drill-down: one service over a range, addressable as #service=NAME&range=minute|hour|day (from /v1/service)
const hashParams = () => new URLSearchParams(location.hash.slice(1));
const link = (params) => "#" + new URLSearchParams(token ? {...params, token: decodeURIComponent(token)} : params).toString();

function table(el, columns, rows, empty = "none in the range") {
  el.tHead.innerHTML = "<tr>" + columns.map((c) => `<th>${c[0]}</th>`).join("") + "</tr>";
  el.tBodies[0].innerHTML = rows.map((r) => "<tr>" + columns.map((c) => `<td>${c[1](r)}</td>`).join("") + "</tr>").join("")
    || `<tr><td colspan="${columns.length}">${empty}</td></tr>`;
}

function renderService(d) {
  $("drill-service").textContent = d.service;
  $("drill-range").innerHTML = ["minute", "hour", "day"].map((g) => g === d.range ? `<b>${g}</b>` : `<a class="range" href="${link({service: d.service, range: g})}">${g}</a>`).join(" · ");
  $("drill-window").textContent = d.start ? `${d.start} → ${d.end}` : "· nothing stored for this service";
  const ts = d.buckets.map((b) => Date.parse(b) / 1000), t0 = ts[0], t1 = ts[ts.length - 1];
  const short = (iso) => iso ? (d.range === "day" ? iso.slice(0, 10) : iso.slice(5, 16).replace("T", " ")) : "";
  const labels = [short(d.start), short(d.end)];
  const find = (role, label) => d.series.find((s) => s.role === role && (label === undefined || s.label === label));
  const points = (s) => s ? s.values.map((v, i) => [ts[i], v]) : [];
  const latest = (s) => { if (!s) return "–"; for (let i = s.values.length - 1; i >= 0; i--) if (s.values[i] != null) return fmtMetric(s.values[i], s.format); return "–"; };
  for (const [role, color] of [["cpm", "#5cc8ff"], ["sla", "#4fd18b"], ["apdex", "#c792ea"], ["errors", "#ff5d5d"]]) {
    const s = find(role);
    drawSeries($("chart-" + role), t0, t1, [{color, points: points(s)}], [], labels);
    $("latest-" + role).textContent = "· latest " + latest(s);
  }
  const pct = ["p50", "p90", "p99"].map((l) => find("percentile", l));
  drawSeries($("chart-latency"), t0, t1, pct.map((s, k) => ({color: ["#4fd18b", "#ffb547", "#ff5d5d"][k], points: points(s)})), [], labels);
  $("latest-latency").textContent = "· latest " + pct.map(latest).join(" / ");
  const num = (v, f) => v == null ? "–" : fmtMetric(v, f);
  const ranked = [["name", (r) => esc(r.name)], ["calls", (r) => fmtInt(r.calls)], ["avg ms", (r) => num(r.avg_ms, {decimals: 1, unit: ""})],
    ["SLA %", (r) => num(r.sla, {decimals: 2, unit: ""})], ["max p99 ms", (r) => num(r.max_p99_ms, {decimals: 0, unit: ""})], ["errors", (r) => fmtInt(r.errors)]];
  table($("drill-endpoints"), ranked, d.endpoints);
  table($("drill-instances"), ranked, d.instances);
  table($("drill-statements"), [["statement", (r) => esc(r.key)], ["latency ms", (r) => num(r.latency_ms, {decimals: 1, unit: ""})],
    ["bucket", (r) => esc(r.time_bucket)]], d.statements);
  // the stored exemplars ([prometheus] exemplars = true), each linked to its trace where [prometheus] trace_url is set
  const traces = d.traces || [];
  $("drill-traces-panel").hidden = !traces.length;
  table($("drill-traces"), [["endpoint", (r) => esc(r.endpoint)], ["latency ms", (r) => num(r.latency_ms, {decimals: 1, unit: ""})],
    ["minute", (r) => esc(r.time_bucket)],
    ["trace", (r) => r.url ? `<a class="trace" href="${esc(r.url)}" target="_blank" rel="noopener">${esc(r.trace_id)}</a>` : `<code>${esc(r.trace_id)}</code>`]], traces);
}

async function loadService() {
  const p = hashParams(), q = new URLSearchParams({service: p.get("service"), range: p.get("range") || "minute"});
  if (p.get("end")) q.set("end", p.get("end"));
  const r = await fetch("/v1/service?" + q, {headers, cache: "no-store"});
  const d = await r.json();
  if (!r.ok) { $("drill-error").textContent = d.error || ("HTTP " + r.status); return; }
  $("drill-error").textContent = ""; renderService(d); $("polls").textContent = ++polls;
}

// firing alerts, and the latest notifications with how their delivery to the webhook went
function renderAlerts(a) {
  $("alerts").hidden = !a;
  if (!a) return;
  const hook = a.webhook;
  $("alert-summary").textContent = `· ${a.rules.length} rules · ${a.evaluations} evaluations · ` + (hook
    ? `webhook: ${hook.delivered} delivered, ${hook.pending} pending, ${hook.failed_attempts} failed attempts` + (hook.given_up ? `, ${hook.given_up} given up` : "")
    : "no webhook (--alert-webhook)") + (a.error ? " · " + a.error : "");
  const rule = (n) => `${esc(n.rule.metric)}${n.rule.label ? "[" + esc(n.rule.label) + "]" : ""} ${esc(n.rule.op)} ${n.rule.threshold} for ${n.rule.for} ${n.rule.granularity}(s)`;
  const value = (v) => v == null ? "no data" : fmt(v);
  $("alerts-firing").innerHTML = a.firing.map((n) =>
    `<div class="bad alert-firing">FIRING · <b>${esc(n.alert)}</b> · ${esc(n.entity)} · ${value(n.value)} at ${n.time_bucket.slice(11, 16)} · since ${n.since} · ${rule(n)}</div>`).join("")
    || (a.rules.length ? "<div>none firing</div>" : "<div>no [[alert]] rules in the metrics TOML</div>");
  $("alerts-recent").innerHTML = a.recent.slice(0, 10).map((n) =>
    `<div class="alert-note">${n.at.slice(11, 19)} · ${n.status === "firing" ? '<span class="bad">firing</span>' : '<span class="good">resolved</span>'} · ${esc(n.alert)} · ${esc(n.entity)} · ${value(n.value)} · ` +
    (n.delivered ? `delivered (attempt ${n.attempt})` : hook ? `<span class="warn">retrying (attempt ${n.attempt})</span>` : "not sent") + "</div>").join("");
}

// a Kafka group member (drainpipe consume): the partitions it holds, read and committed offsets, lag
function renderKafka(k) {
  $("kafka").hidden = !k;
  if (!k) return;
  $("kafka-summary").textContent = `· group ${k.group} · assigned ${k.assignments} · revoked ${k.revocations} · lost ${k.losses} · rewound ${k.rewinds} · fenced commits ${k.fenced_commits} · paused for the store ${k.pauses}` + (k.failed ? " · stopped: " + k.failed : "");
  table($("kafka-partitions"), [["topic", (p) => esc(p.topic)], ["partition", (p) => p.partition], ["next offset", (p) => fmtInt(p.offset)],
    ["stored", (p) => fmtInt(p.committed)], ["lag", (p) => p.lag == null ? "–" : fmtInt(p.lag)]], k.partitions, "none assigned");
}

function render(d) {
  const ing = d.ingest, st = d.store;
  const s = $("status");
  if (d.draining) { s.textContent = "draining"; s.className = "warn"; }
  else if (!st.available) { s.textContent = "store unavailable"; s.className = "bad"; }
  else { s.textContent = "live"; s.className = "ok"; }
  $("uptime").textContent = dur(d.uptime_s);
  $("store-url").textContent = d.store_url;
  $("events-rate").textContent = fmt(ing.events_per_s);
  $("accepted-total").textContent = fmtInt(ing.accepted);
  $("rejected-total").textContent = fmtInt(ing.rejected);
  $("dropped-total").textContent = fmtInt(ing.dropped);
  $("refused-total").textContent = fmtInt(ing.refused_429 + ing.refused_503);
  $("store-latency").textContent = `${st.p50_write_ms} / ${st.p99_write_ms}`;
  $("rebalance-total").textContent = fmtInt(d.queues.reduce((a, q) => a + q.rebalances, 0));
  renderHeat(d.queues);
  renderLoad("L1", d); renderLoad("L2", d); renderRates(d); renderTop(d.top_services); renderAlerts(d.alerts); renderKafka(d.kafka);
  $("rebalances").innerHTML = d.rebalances.slice(-12).reverse().map((r) =>
    `<div>${new Date(r.at * 1000).toLocaleTimeString()} · ${r.queue.split("-").pop()} · moved ${r.moved} · ${r.duration_ms.toFixed(2)} ms · max/min ${r.ratio_before ?? "∞"} → ${r.ratio_after ?? "∞"}</div>`).join("") || "<div>none yet</div>";
  $("slow-calls").innerHTML = d.queues.flatMap((q) => q.slow_calls.map((c) =>
    `<div class="bad">${q.role} · ${c.type}.${c.method} on thread ${c.task} · running ${c.seconds.toFixed(1)} s</div>`)).join("") || "<div>none</div>";
  $("updated").textContent = new Date(d.now * 1000).toLocaleTimeString();
  $("polls").textContent = ++polls;
}

let timer = null;
async function poll() {
  clearTimeout(timer);
  const drill = hashParams().has("service");
  $("live").hidden = drill; $("drill").hidden = !drill;
  try {
    if (drill) await loadService();
    else {
      const r = await fetch("/v1/stats", {headers, cache: "no-store"});
      if (!r.ok) throw new Error("HTTP " + r.status + (r.status === 401 ? " (add #token=… to the URL)" : ""));
      render(await r.json());
    }
    $("error").textContent = "";
  } catch (e) { $("error").textContent = String(e.message || e); }
  timer = setTimeout(poll, drill ? 5000 : 1000);  // the drill-down reads the store: every 5 s is plenty
}
window.addEventListener("hashchange", poll);
$("back").addEventListener("click", (e) => { e.preventDefault(); location.hash = link({}).slice(1); });
poll();
</script>
</body>
</html>
"""

PAGE = PAGE_TEXT.encode("utf-8")
