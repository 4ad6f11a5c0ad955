// areal view: polls the server's JSON and writes the run's live numbers on the graph, beside it and below it.
// No library and nothing fetched from elsewhere: the page, this script and its style come with areal.
"use strict";

const SVGNS = "http://www.w3.org/2000/svg";
const LIVE_MS = 1000, METRICS_MS = 2000, SAMPLES_MS = 5000;
const LAG_COLOURS = ["#2e7d32", "#7cb342", "#fbc02d", "#fb8c00", "#e53935", "#8e24aa", "#5e35b1"];
const state = { plan: null, nodePool: {}, metrics: [], epoch: 0, next: 0, labels: new Map(), query: "" };

const $ = (id) => document.getElementById(id);
const wait = (ms) => new Promise((done) => setTimeout(done, ms));
const has = (x) => x !== null && x !== undefined && !Number.isNaN(x);
const num = (x, digits = 2) => (has(x) ? Number(x).toFixed(digits) : "—");
const pct = (x) => (has(x) ? `${Math.round(x * 100)}%` : "—");
const ago = (s) => (!has(s) ? "—" : s < 90 ? `${s.toFixed(1)} s ago` : `${(s / 60).toFixed(1)} min ago`);

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function loop(refresh, ms) {
  const tick = async () => {
    try { await refresh(); } catch (err) { console.warn(err); }
    setTimeout(tick, ms);
  };
  tick();
}

async function start() {
  while (!state.plan) {
    try {
      const info = await getJSON("/api/plan");
      state.plan = info.plan;
      state.nodePool = info.node_pool;
      $("run-dir").textContent = info.run_dir;
      $("graph-name").textContent = info.plan.graph;
      document.title = `areal view · ${info.plan.graph}`;
    } catch (err) {
      await wait(LIVE_MS);  // the run has not written its plan yet
    }
  }
  const drawn = await fetch("/api/graph.svg", { cache: "no-store" });
  $("graph").innerHTML = drawn.ok ? await drawn.text()
    : `<p class="error">${escapeHtml((await drawn.json().catch(() => ({}))).error || drawn.statusText)}</p>`;
  $("s-filter").addEventListener("submit", (event) => { event.preventDefault(); refreshSamples(); });
  loop(refreshLive, LIVE_MS);
  loop(refreshMetrics, METRICS_MS);
  loop(refreshSamples, SAMPLES_MS);
}

// -- the live numbers ----------------------------------------------------------------------------

async function refreshLive() {
  const live = await getJSON("/api/live");
  const status = live.status || {};
  const badge = $("run-state");
  const stale = live.run.alive && has(live.run.status_age_s) && live.run.status_age_s > 5;
  badge.textContent = !live.run.alive && status.status !== "stopped" ? "not running"
    : stale ? `no news for ${live.run.status_age_s.toFixed(0)} s` : status.status || "starting";
  badge.className = `badge ${stale || (!live.run.alive && status.status !== "stopped") ? "stale"
    : live.run.alive ? "running" : "stopped"}`;
  $("h-version").textContent = has(status.version) ? `${status.version} / ${status.steps}` : "—";
  $("h-elapsed").textContent = has(status.elapsed_s) ? `${status.elapsed_s.toFixed(0)} s` : "—";
  const acc = status.accounting;
  $("h-accounting").textContent = acc ? `${acc.trained} trained · ${acc.failed} failed · ${acc.filtered} filtered`
    + ` · ${acc.in_flight} in flight` : "—";
  $("window").textContent = num(live.activity.window_s, 0);
  drawOnGraph(live);
  fillTables(live);
}

function drawOnGraph(live) {
  const nodes = live.activity.nodes;
  for (const node of Object.keys(state.nodePool)) {
    const el = document.getElementById(`node-${node}`);
    const n = nodes[node];
    if (!el || !n) continue;
    const box = firstShape(el).getBBox();
    busyBar(el, `bar-${node}`, box, n.busy);
    const mid = box.y + box.height / 2 - 6;
    const text = n.calls ? `busy ${pct(n.busy)} · ${num(n.samples_per_s, 1)}/s`
      : n.busy >= 0.005 || !n.last_call ? `busy ${pct(n.busy)}`
        : `last call ${num(n.last_call.seconds, 1)} s, ${ago(n.last_call.ago_s)}`;  // longer than the window
    label(`node-${node}`, el, [text], "node",
      [[box.x + box.width + 6, mid, "start"], [box.x - 6, mid, "end"], [box.x, box.y + box.height + 6, "start"],
        [box.x, box.y - 16, "start"]]);
  }
  for (const [name, pool] of Object.entries(live.pools)) {
    const el = document.getElementById(`pool-${name}`);
    if (!el || !has(pool.busy)) continue;
    const box = firstShape(el).getBBox();
    const right = box.x + box.width, bottom = box.y + box.height;
    const cpu = has(pool.cpu_share) ? ` · ${pct(pool.cpu_share)} of the CPU` : "";
    label(`pool-${name}`, el, [`workers busy ${pct(pool.busy)}${cpu} · ${pool.ready}/${pool.replicas} up`], "pool",
      [[right, box.y - 15, "end"], [box.x, box.y - 15, "start"], [right, bottom + 2, "end"], [box.x, bottom + 2, "start"],
        [right + 6, box.y, "start"]]);
  }
  const gate = (live.status || {}).gate;
  for (const [key, c] of Object.entries(live.channels)) {
    const el = document.getElementById(key);
    if (!el) continue;
    const gated = el.classList.contains("gated");
    const lines = gated && gate ? gateLines(gate, live) : [channelLine(c)];
    if (lines[0]) label(key, el, lines, gated ? "gate" : "channel", alongPath(el));
  }
  for (const el of document.querySelectorAll("g.edge.weights")) {
    const [, src, dst] = el.id.split(":");
    const route = live.routes[`${state.nodePool[src]}>${state.nodePool[dst]}`];
    if (route) label(el.id, el, routeLines(route), "weights", alongPath(el));
  }
}

function channelLine(c) {
  const parts = [];
  if (has(c.samples_per_s)) parts.push(`${num(c.samples_per_s, 1)} samples/s`);
  else if (has(c.groups_per_s)) parts.push(`${num(c.groups_per_s, 1)} groups/s`);
  if (has(c.in_flight)) parts.push(`${c.in_flight} in flight`);
  if (has(c.held)) parts.push(`${c.held} held`);
  if (c.blocked > 0.05) parts.push(`blocked ${pct(c.blocked)}`);
  return parts.join(" · ");
}

function gateLines(gate, live) {
  const lines = [`admitted ${gate.admitted} · open ${gate.open} · unconsumed ${gate.unconsumed}`];
  const awaited = gate.awaited;
  const training = awaited && (live.activity.trainers[awaited.trainer] || {}).training_s;
  if (awaited && live.run.alive && has(training)) {
    lines.push(`step ${awaited.trainer_version + 1} has its groups: training for ${num(training, 1)} s`);
  } else if (awaited && live.run.alive) {
    lines.push(awaited.admitted
      ? `step ${awaited.trainer_version + 1} waits on group ${awaited.group} (admitted at v${awaited.admitted_at},`
        + ` ${awaited.trainer_version - awaited.admitted_at} behind) for ${num(awaited.waiting_s, 1)} s`
      : `step ${awaited.trainer_version + 1} waits on group ${awaited.group}: not admitted yet`);
  }
  return lines;
}

function routeLines(route) {
  const lines = [`v${has(route.published.version) ? route.published.version : "—"} published ${ago(route.published.ago_s)}`];
  for (const [worker, held] of Object.entries(route.followers)) {
    lines.push(`${worker} loaded v${held.version} ${ago(held.ago_s)}`);
  }
  return lines;
}

function firstShape(el) {
  return el.querySelector("rect, polygon, ellipse, path") || el;
}

function alongPath(el) {
  // spots beside the arrow, middle first, left then right of it
  const path = el.querySelector("path");
  if (!path) return [];
  const length = path.getTotalLength();
  return [0.5, 0.3, 0.7, 0.15, 0.85].flatMap((share) => {
    const at = path.getPointAtLength(length * share);
    return [[at.x - 8, at.y - 6, "end"], [at.x + 8, at.y - 6, "start"]];
  });
}

function obstacles(svg) {
  // what a label must not cover: the picture's own text and boxes, and the labels placed so far
  if (!state.obstacles) {
    state.obstacles = [...svg.querySelectorAll("text, g.node > :first-child")].filter((el) => !el.closest(".live"))
      .map((el) => el.getBBox());
  }
  return state.obstacles;
}

function overlap(a, b) {
  const w = Math.min(a.x + a.width, b.x + b.width) - Math.max(a.x, b.x);
  const h = Math.min(a.y + a.height, b.y + b.height) - Math.max(a.y, b.y);
  return w > 0 && h > 0 ? w * h : 0;
}

function label(key, el, lines, kind, spots) {
  let g = state.labels.get(key);
  if (!g) {
    g = document.createElementNS(SVGNS, "g");
    g.setAttribute("class", `live ${kind}`);
    g.dataset.key = key;
    g.appendChild(document.createElementNS(SVGNS, "rect")).setAttribute("class", "back");
    g.appendChild(document.createElementNS(SVGNS, "text"));
    el.parentNode.appendChild(g);  // the element's own coordinates (Graphviz wraps everything in a transform)
    state.labels.set(key, g);
  }
  const text = g.querySelector("text");
  const write = ([x, y, anchor]) => {
    text.setAttribute("text-anchor", anchor);
    text.textContent = "";
    lines.forEach((line, i) => {
      const span = text.appendChild(document.createElementNS(SVGNS, "tspan"));
      span.setAttribute("x", x);
      span.setAttribute("y", y + 12 * (i + 1));
      span.textContent = line;
    });
    return text.getBBox();
  };
  const others = obstacles(el.ownerSVGElement);
  const covered = (box) => others.reduce((sum, other) => (g.placed && other === g.placed.box ? sum
    : sum + overlap(box, other)), 0);
  let box = g.spot ? write(g.spot) : null;
  if (!box || (g.placed && covered(box) > g.placed.covered)) {  // first drawn, or grown over something: place anew
    const tried = spots.map((spot) => ({ spot, covered: covered(write(spot)) }));
    const best = tried.reduce((a, b) => (b.covered < a.covered ? b : a));
    g.spot = best.spot;
    box = write(best.spot);
    if (g.placed) others.splice(others.indexOf(g.placed.box), 1);
    g.placed = { box, covered: best.covered };
    others.push(box);
  }
  const back = g.querySelector("rect");
  for (const [name, value] of [["x", box.x - 3], ["y", box.y - 1], ["width", box.width + 6], ["height", box.height + 2],
    ["rx", 3]]) back.setAttribute(name, value);
}

function busyBar(el, key, box, busy) {
  let bar = state.labels.get(key);
  if (!bar) {
    bar = el.parentNode.appendChild(document.createElementNS(SVGNS, "rect"));
    bar.setAttribute("class", "busy-bar");
    state.labels.set(key, bar);
  }
  const share = Math.max(0, Math.min(1, busy || 0));
  bar.setAttribute("x", box.x);
  bar.setAttribute("y", box.y + box.height + 2);
  bar.setAttribute("width", box.width * share);
  bar.setAttribute("height", 4);
  bar.setAttribute("fill", share > 0.85 ? "#e53935" : share > 0.5 ? "#fb8c00" : "#43a047");
}

function fillTables(live) {
  const gate = (live.status || {}).gate;
  const rows = gate ? [["η (eta)", `${gate.eta} (${live.run.mode})`], ["batch size B", gate.batch_size],
    ["admitted groups", gate.admitted], ["freed groups", gate.freed], ["open slots", gate.open],
    ["unconsumed groups", gate.unconsumed]] : [];
  const awaited = gate && gate.awaited;
  const training = awaited && (live.activity.trainers[awaited.trainer] || {}).training_s;
  if (awaited && live.run.alive && has(training)) {
    rows.push([`step ${awaited.trainer_version + 1}`, `training for ${num(training, 1)} s (its groups all came)`]);
  } else if (awaited && live.run.alive) {
    rows.push(["next step waits on", `group ${awaited.group}` + (awaited.admitted
      ? ` (admitted at v${awaited.admitted_at}; trainer '${awaited.trainer}' at v${awaited.trainer_version})`
      : " (not admitted yet)")], ["waiting for", `${num(awaited.waiting_s, 1)} s`]);
  }
  for (const [pool, t] of Object.entries(live.activity.trainers)) {
    rows.push([`'${pool}' idle before steps`, pct(t.waiting)]);
    const w = t.last_wait;
    if (w) {
      rows.push([`its last wait (v${w.version})`, `${num(w.seconds, 2)} s` + (has(w.straggler)
        ? `, for group ${w.straggler} (admitted at v${w.admitted_at})` : ", none: its groups were there")]);
    }
  }
  table("gate", null, rows);
  const role = (name) => state.plan.pools.find((q) => q.name === name).role;
  table("pools", ["pool", "up", "busy", "nodes: busy, samples/s", "long calls"], Object.entries(live.pools).map(
    ([name, p]) => [
      name, role(name) === "source" ? "controller" : `${p.ready}/${p.replicas}`, pct(p.busy),
      state.plan.pools.find((q) => q.name === name).nodes.map((n) => {
        const a = live.activity.nodes[n];
        return a ? `${n} ${pct(a.busy)}${a.calls ? `, ${num(a.samples_per_s, 1)}/s` : ""}` : n;
      }).join("; "),
      (p.long_calls || []).join("; ") || "—"]));
  table("channels", ["channel", "samples/s", "groups/s", "between ends", "blocked"],
    Object.entries(live.channels).map(([key, c]) => [key.replace(/^channel:/, "").replace(":", " → "),
      num(c.samples_per_s, 1), num(c.groups_per_s, 2),
      has(c.in_flight) ? `${c.in_flight} in flight` : has(c.held) ? `${c.held} held` : "—", pct(c.blocked)]));
  const routeRows = [];
  for (const route of Object.values(live.routes)) {
    routeRows.push([`${route.trainer} → ${route.follower}`, "published", route.published.version,
      ago(route.published.ago_s)]);
    for (const [worker, held] of Object.entries(route.followers)) routeRows.push(["", worker, held.version, ago(held.ago_s)]);
  }
  table("routes", ["route", "who", "version", "when"], routeRows);
}

function table(id, head, rows) {
  const html = (head ? `<tr>${head.map((h) => `<th>${escapeHtml(h)}</th>`).join("")}</tr>` : "")
    + rows.map((row) => `<tr>${row.map((cell) => `<td>${escapeHtml(String(cell ?? "—"))}</td>`).join("")}</tr>`)
      .join("");
  $(id).innerHTML = html;
}

function escapeHtml(text) {
  return String(text).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
}

// a prompt of chat messages ([{role, content}, ...]) as its lines, "role: content"
function promptText(value) {
  return Array.isArray(value) ? value.map((m) => `${m.role}: ${m.content}`).join("\n") : value;
}

// -- curves ---------------------------------------------------------------------------------------

async function refreshMetrics() {
  const got = await getJSON(`/api/metrics?since=${state.next}&epoch=${state.epoch}`);
  if (got.epoch !== state.epoch || got.from === 0) state.metrics = [];
  state.epoch = got.epoch;
  state.metrics.push(...got.lines);
  state.next = got.next;
  const steps = state.metrics.filter((m) => m.kind === "step");
  const evals = state.metrics.filter((m) => m.kind === "eval");
  const last = steps[steps.length - 1];
  $("h-rate").textContent = last ? num(last.samples_per_s, 2) : "—";
  $("h-reward").textContent = last ? num(last.reward_mean, 3) : "—";
  const lastEval = evals[evals.length - 1];
  $("h-pass").textContent = lastEval ? `${num(lastEval["pass@1"], 3)} at v${lastEval.version}` : "—";
  const charts = got.axes;  // each chart's ranges and ticks, worked out by the server (areal/view/axes.py)
  lineChart($("c-reward"), charts["c-reward"], [
    { name: "reward mean", colour: "#1f6fb2", points: steps.map((m) => [m.version, m.reward_mean]) },
    { name: "solved", colour: "#43a047", points: steps.map((m) => [m.version, m.solved]) }], "version");
  lineChart($("c-pass"), charts["c-pass"],
    [{ name: "pass@1", colour: "#8e24aa", points: evals.map((m) => [m.version, m["pass@1"]]) }], "version");
  lineChart($("c-rate"), charts["c-rate"],
    [{ name: "samples/s", colour: "#fb8c00", points: steps.map((m) => [m.version, m.samples_per_s]) }], "version");
  lineChart($("c-entropy"), charts["c-entropy"],
    [{ name: "entropy", colour: "#00897b", points: steps.map((m) => [m.version, m.entropy]) }], "version");
  lagChart($("c-lag"), charts["c-lag"], steps);
}

const W = 320, H = 180, PAD = { left: 38, right: 8, top: 16, bottom: 22 };

function scale(axis, lo, hi) {
  const span = axis.max - axis.min || 1;
  return { ...axis, at: (v) => lo + ((v - axis.min) / span) * (hi - lo) };
}

function axes(svg, xs, ys, xName) {
  let out = `<line x1="${PAD.left}" y1="${H - PAD.bottom}" x2="${W - PAD.right}" y2="${H - PAD.bottom}" stroke="#b8c0cc"/>`
    + `<line x1="${PAD.left}" y1="${PAD.top}" x2="${PAD.left}" y2="${H - PAD.bottom}" stroke="#b8c0cc"/>`;
  ys.ticks.forEach((v, k) => {
    out += `<text x="${PAD.left - 4}" y="${ys.at(v) + 3}" text-anchor="end">${ys.labels[k]}</text>`;
  });
  xs.ticks.forEach((u, k) => {
    out += `<text x="${xs.at(u)}" y="${H - PAD.bottom + 12}" text-anchor="middle">${xs.labels[k]}</text>`;
  });
  out += `<text x="${W - PAD.right}" y="${H - 2}" text-anchor="end">${xName}</text>`;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  return out;
}

function lineChart(svg, chart, series, xName) {
  const points = series.flatMap((s) => s.points.filter(([, y]) => has(y)));
  if (!points.length) { svg.innerHTML = `<text x="10" y="20">no records yet</text>`; return; }
  const xs = scale(chart.x, PAD.left, W - PAD.right);
  const ys = scale(chart.y, H - PAD.bottom, PAD.top);
  let out = axes(svg, xs, ys, xName);
  series.forEach((s, i) => {
    const line = s.points.filter(([, y]) => has(y)).map(([x, y]) => `${xs.at(x).toFixed(1)},${ys.at(y).toFixed(1)}`);
    out += `<polyline fill="none" stroke="${s.colour}" stroke-width="1.6" points="${line.join(" ")}"/>`;
    if (line.length === 1) out += `<circle cx="${line[0].split(",")[0]}" cy="${line[0].split(",")[1]}" r="2.5" fill="${s.colour}"/>`;
    out += `<text x="${PAD.left + 6 + i * 90}" y="11" style="fill:${s.colour}">${s.name}</text>`;
  });
  svg.innerHTML = out;
}

function lagChart(svg, chart, steps) {
  const rows = steps.filter((m) => m.staleness && Object.keys(m.staleness).length);
  if (!rows.length) { svg.innerHTML = `<text x="10" y="20">no records yet</text>`; return; }
  const maxLag = Math.max(...rows.flatMap((m) => Object.keys(m.staleness).map(Number)));
  const xs = scale(chart.x, PAD.left + 4, W - PAD.right - 4);
  const ys = scale(chart.y, H - PAD.bottom, PAD.top);
  const width = Math.max(1, ((W - PAD.left - PAD.right) / rows.length) * 0.8);
  let out = axes(svg, xs, ys, "version");
  rows.forEach((m) => {
    let base = 0;
    for (let lag = 0; lag <= maxLag; lag++) {
      const count = m.staleness[String(lag)] || 0;
      if (!count) continue;
      const y0 = ys.at(base), y1 = ys.at(base + count);
      out += `<rect x="${(xs.at(m.version) - width / 2).toFixed(1)}" y="${y1.toFixed(1)}" width="${width.toFixed(1)}"`
        + ` height="${(y0 - y1).toFixed(1)}" fill="${LAG_COLOURS[lag % LAG_COLOURS.length]}"><title>v${m.version}: `
        + `lag ${lag}: ${count}</title></rect>`;
      base += count;
    }
  });
  for (let lag = 0; lag <= maxLag; lag++) {
    out += `<text x="${PAD.left + 6 + lag * 42}" y="11" style="fill:${LAG_COLOURS[lag % LAG_COLOURS.length]}">lag ${lag}</text>`;
  }
  svg.innerHTML = out;
}

// -- samples --------------------------------------------------------------------------------------

async function refreshSamples() {
  const form = new FormData($("s-filter"));
  const query = new URLSearchParams();
  for (const name of ["status", "step", "limit"]) if (form.get(name)) query.set(name, form.get(name));
  for (const condition of String(form.get("where") || "").split(";")) if (condition.trim()) query.append("where", condition.trim());
  let got;
  try {
    got = await getJSON(`/api/samples?${query}`);
    $("s-error").textContent = "";
  } catch (err) {
    $("s-error").textContent = err.message;
    return;
  }
  $("s-count").textContent = `${got.matched} of ${got.total} match · newest first`;
  const reward = state.plan.reward_field;
  const pick = (fields, suffix) => Object.entries(fields).find(([k]) => k.endsWith(suffix));
  const rows = got.rows.map((r) => {
    const prompt = pick(r.fields, ".prompt"), completion = pick(r.fields, ".completion");
    return `<tr title="${escapeHtml(JSON.stringify(r.fields))}"><td>${r.sample_id}</td><td>${r.group_id ?? "—"}</td>`
      + `<td class="status-${r.status}">${r.status}</td><td>${r.step ?? "—"}</td><td>${r.lag ?? "—"}</td>`
      + `<td>${has(r.fields[reward]) ? num(r.fields[reward], 3) : "—"}</td>`
      + `<td class="text">${escapeHtml(prompt ? promptText(prompt[1]) : "")}</td>`
      + `<td class="text">${escapeHtml(completion ? completion[1] : "")}</td>`
      + `<td>${escapeHtml(r.reason ? `${r.node}: ${r.reason}` : "")}</td></tr>`;
  });
  $("s-table").innerHTML = `<tr><th>sample</th><th>group</th><th>status</th><th>step</th><th>lag</th>`
    + `<th>${escapeHtml(reward || "reward")}</th><th>prompt</th><th>completion</th><th>why</th></tr>${rows.join("")}`;
}

start();
