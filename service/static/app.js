// ferry dashboard: fetches the JSON API, then follows /api/v1/events (Server-Sent Events) to stay live.
// Plain DOM code; every value is inserted with textContent (never innerHTML), so names cannot inject markup.
"use strict";

const API = "/api/v1";
const state = { token: sessionStorage.getItem("ferry-token") || null, status: null, transfers: new Map(),
  limits: null, links: [], pendingAction: null, connected: false };

// ---------- formatting ----------
function fmtBytes(n) {
  if (n == null) return "—";
  const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(n < 10 ? 2 : 1) : String(Math.round(n))) + " " + u[i];
}
const fmtRate = (bps) => (bps ? fmtBytes(bps) + "/s" : "0 B/s");
function fmtDur(s) {
  if (s == null) return "—";
  s = Math.max(0, s);
  if (s < 1) return "0 s";
  if (s < 90) return Math.round(s) + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}
function fmtAgo(t) { return fmtDur(Date.now() / 1000 - t) + " ago"; }
const short = (v) => (v ? String(v).replace(/^xxh128:|^blake3:/, "").slice(0, 10) : "—");

// ---------- DOM helpers ----------
const $ = (id) => document.getElementById(id);
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids) if (kid != null) e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  return e;
}
function toast(msg, bad) {
  const t = $("toast");
  t.textContent = msg;
  t.className = "toast" + (bad ? " bad" : "");
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, bad ? 6000 : 3000);
}

// ---------- HTTP ----------
class HttpError extends Error { constructor(status, msg) { super(msg); this.status = status; } }
async function api(path, opts = {}) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = "Bearer " + state.token;
  if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(API + path, { method: opts.method || "GET", headers,
    body: opts.body === undefined ? undefined : JSON.stringify(opts.body) });
  if (!r.ok) {
    let detail = r.statusText;
    try {
      const j = await r.json();
      detail = typeof j.detail === "string" ? j.detail
        : Array.isArray(j.detail) ? j.detail.map((d) => d.msg || JSON.stringify(d)).join("; ") : JSON.stringify(j.detail);
    } catch (_) {}
    throw new HttpError(r.status, detail);
  }
  return r.json();
}

// ---------- token ----------
function askToken(why) {
  return new Promise((resolve) => {
    const d = $("token-dialog");
    $("token-why").textContent = why || "Control actions need the service's bearer token.";
    $("token-input").value = "";
    const done = (tok) => { d.close(); resolve(tok); };
    $("token-form").onsubmit = (ev) => {
      ev.preventDefault();
      const tok = $("token-input").value.trim();
      if (!tok) return;
      state.token = tok;
      if ($("token-remember").checked) sessionStorage.setItem("ferry-token", tok);
      done(tok);
    };
    $("token-cancel").onclick = () => done(null);
    d.oncancel = () => resolve(null);
    d.showModal();
    $("token-input").focus();
  });
}
function forgetToken() { state.token = null; sessionStorage.removeItem("ferry-token"); }

// Run a mutating call; ask for the token first if none, and again once if the server refuses it.
async function control(label, path, method, body) {
  for (let attempt = 0; attempt < 2; attempt++) {
    if (!state.token && !(await askToken(attempt ? "That token was refused; try again." : null))) return null;
    try {
      const res = await api(path, { method, body });
      toast(res.message || label + ": done");
      return res;
    } catch (e) {
      if (e.status === 403 && /disabled/.test(e.message)) { toast(e.message, true); return null; }  // no token configured
      if (e.status === 401 || e.status === 403) { forgetToken(); continue; }
      toast(label + " failed: " + e.message, true);
      return null;
    }
  }
  toast(label + ": token refused", true);
  return null;
}

// ---------- renderers ----------
function renderStatus(st) {
  state.status = st;
  state.limits = st.limits;
  const s = $("state");
  s.textContent = st.paused ? "paused" : st.transfers_in_flight ? "syncing" : "idle";
  s.className = "pill " + (st.paused ? "" : st.transfers_in_flight ? "pill-wait" : "pill-ok");
  const b = $("btn-pause");
  b.textContent = st.paused ? "Resume" : "Pause";
  b.classList.toggle("resume", st.paused);
  b.setAttribute("aria-pressed", st.paused ? "true" : "false");
  $("sum-rate").textContent = fmtRate(st.rate_bps);
  $("sum-inflight").textContent = String(st.transfers_in_flight);
  $("sum-pending").textContent = `${fmtBytes(st.pending_bytes)} · ${st.pending_shards} shards`;
  $("sum-copied").textContent = fmtBytes(st.copied_bytes_total);
  $("sum-eta").textContent = st.eta_seconds == null ? "—" : fmtDur(st.eta_seconds);
  $("sum-limit").textContent = st.limits.global_bps ? fmtRate(st.limits.global_bps) : "unlimited";
  $("foot").textContent = `ferry ${st.version} · up ${fmtDur(st.uptime_seconds)} · SLA ${st.sla_minutes} min`;
  renderWriters(st.other_writers || []);
}

function renderWriters(writers) {
  const list = $("writers-list");
  list.replaceChildren(...writers.map((w) => {
    const li = document.createElement("li");
    li.textContent = `${w.dataset} at ${w.cluster}: held by ${w.holder}`;
    return li;
  }));
  $("writers").hidden = writers.length === 0;
}

function renderMatrix(m) {
  const table = $("matrix");
  const byKey = new Map(m.cells.map((c) => [c.dataset + "\u0000" + c.cluster, c]));
  const head = el("tr", {}, el("th", { scope: "col", text: "dataset" }));
  for (const cl of m.clusters) head.append(el("th", { scope: "col", text: cl }));
  table.tHead.replaceChildren(head);
  const rows = [];
  for (const ds of m.datasets) {
    const tr = el("tr", { "data-dataset": ds }, el("th", { scope: "row", text: ds }));
    for (const cl of m.clusters) {
      const c = byKey.get(ds + "\u0000" + cl);
      if (!c) { tr.append(el("td", { class: "cell st-none", text: "–", title: "not replicated here" })); continue; }
      const src = c.role === "source";
      // a source with an open error (its manifest cannot be read): an error cell, not "100% source"
      const pct = src && c.state === "source" ? 100 : c.percent;
      const lag = c.lag_seconds == null ? "" : "lag " + fmtDur(c.lag_seconds);
      const meta = src ? (c.state === "failed" ? "source · cannot be read (see errors)" : `source · v ${short(c.target_version)}`)
        : `${c.state} · ${c.verified_shards}/${c.total_shards} shards${lag ? " · " + lag : ""}`;
      const label = `${ds} on ${cl}: ${c.state}, ${pct.toFixed(1)}% verified (${c.verified_shards} of ${c.total_shards} shards, `
        + `${fmtBytes(c.verified_bytes)} of ${fmtBytes(c.total_bytes)})${lag ? ", " + lag : ""}`;
      tr.append(el("td", { class: "cell st-" + c.state, "data-cluster": cl, "data-state": c.state,
        "data-percent": pct.toFixed(1), title: label, "aria-label": label, tabindex: "0" },
        el("span", { class: "pct", text: pct.toFixed(pct === 100 || pct === 0 ? 0 : 1) + "%" }),
        el("span", { class: "meta", text: meta }),
        el("div", { class: "bar", "aria-hidden": "true" }, el("i", { style: `width:${pct}%` }))));
    }
    rows.push(tr);
  }
  table.tBodies[0].replaceChildren(...rows);
  $("matrix-empty").hidden = m.datasets.length > 0;
}

function transferKey(t) { return `${t.dataset}|${t.shard}|${t.destination}`; }
function renderTransfers(list) {
  state.transfers = new Map(list.map((t) => [transferKey(t), t]));
  drawTransfers();
}
function drawTransfers() {
  const rows = [];
  const list = [...state.transfers.values()].sort((a, b) => a.started_at - b.started_at);
  for (const t of list) {
    const pct = t.bytes_total ? Math.min(100, (100 * t.bytes_done) / t.bytes_total) : 0;
    const name = t.shard.split("/").pop();
    rows.push(el("tr", { "data-key": transferKey(t) },
      el("td", { class: "mono ellip", title: `${t.dataset}/${t.shard}` }, el("b", { text: t.dataset }), " ", name),
      el("td", { class: "nowrap", text: `${t.source} → ${t.destination}` }),
      el("td", {}, el("div", { class: "prog" },
        el("div", { class: "track", role: "progressbar", "aria-valuemin": "0", "aria-valuemax": "100",
          "aria-valuenow": pct.toFixed(0), "aria-label": `${name} ${pct.toFixed(0)}%` },
          el("div", { class: "fill", style: `width:${pct}%` })),
        el("span", { class: "lbl", text: pct.toFixed(0) + "%" }))),
      el("td", { class: "num", text: fmtRate(t.rate_bps) })));
  }
  $("transfers").tBodies[0].replaceChildren(...rows);
  $("transfers-empty").hidden = rows.length > 0;
  $("transfers-count").textContent = rows.length ? `(${rows.length})` : "";
}

// The newest version's egress over a link (bytes, and their price where [[links]] sets one); the rest in the title.
function egressCell(l) {
  const all = l.egress || [];
  const last = all[0];
  if (!last) return el("td", { class: "num", text: "—" });
  const one = (e) => fmtBytes(e.bytes) + (l.price_per_gb ? ` · $${e.cost.toFixed(2)}` : "");
  const title = all.map((e) => `${e.dataset} ${short(e.version)}: ${one(e)}`).join("\n");
  return el("td", { class: "num", title, "data-egress": String(last.bytes) }, `${one(last)} `,
    el("span", { class: "hint", text: short(last.version) }));
}

// The link's rate now, and the rate the last routed swarm plan gives it ([swarm] routed) where one does.
function rateCell(l) {
  if (l.planned_bps == null) return el("td", { class: "num", text: fmtRate(l.rate_bps) });
  return el("td", { class: "num", "data-planned": String(l.planned_bps), title: "now / planned by the route planner" },
    `${fmtRate(l.rate_bps)} / ${fmtRate(l.planned_bps)} planned`);
}

function renderLinks(links) {
  state.links = links;
  const slaS = (state.status?.sla_minutes ?? 60) * 60;
  const rows = links.map((l) => {
    const share = l.share_within_sla;
    const shareTxt = share == null ? "no versions yet" : `${Math.round(share * 100)}% (${l.versions_within_sla}/${l.versions_total})`;
    return el("tr", { "data-link": `${l.source}->${l.destination}` },
      el("td", { class: "nowrap", text: `${l.source} → ${l.destination}` }),
      el("td", { class: "num" + ((l.lag_seconds ?? 0) > slaS ? " lag-bad" : ""), text: l.lag_seconds ? fmtDur(l.lag_seconds) : "current" }),
      el("td", {}, el("div", { class: "sla" + (share != null && share < 1 ? " miss" : "") },
        el("div", { class: "track", "aria-hidden": "true" }, el("div", { class: "fill", style: `width:${(share ?? 0) * 100}%` })),
        el("span", { text: shareTxt + ` in ${l.sla_minutes} min` }))),
      rateCell(l),
      el("td", { class: "num", text: l.limit_bps ? fmtRate(l.limit_bps) : "—" }),
      egressCell(l));
  });
  $("links").tBodies[0].replaceChildren(...rows);
}

function renderErrors(errors) {
  const rows = errors.map((e) => el("tr", { "data-error-id": String(e.id) },
    el("td", { class: "num", text: fmtAgo(e.at), title: new Date(e.at * 1000).toLocaleString() }),
    el("td", { class: "mono ellip", title: `${e.dataset}/${e.shard} → ${e.cluster}` },
      el("b", { text: e.dataset }), " ", e.shard.split("/").pop(), " → ", e.cluster),
    el("td", { class: "reason", text: (e.retryable ? "" : "[fatal] ") + e.reason }),
    el("td", { class: "num", text: String(e.attempts) }),
    el("td", {}, el("button", { type: "button", class: "retry", "aria-label": `Retry ${e.shard} on ${e.cluster}`,
      onclick: async (ev) => {
        const btn = ev.currentTarget;
        btn.disabled = true;
        const r = await control("Retry", "/retry", "POST", { id: e.id });
        if (r) await refresh(["errors", "replicas"]); else btn.disabled = false;
      } }, "Retry"))));
  $("errors").tBodies[0].replaceChildren(...rows);
  $("errors-empty").hidden = rows.length > 0;
  $("btn-retry-all").hidden = rows.length < 2;
  $("errors-count").textContent = rows.length ? `(${rows.length})` : "";
}

// Jobs: one row per registered loader (a rank of a training job); a stall share over 5% is flagged.
const STALL_BAD = 0.05;
function renderJobs(jobs) {
  const rows = jobs.map((j) => {
    const share = j.stats.stall_share;
    const reads = j.sources.map((s) => `${s.dataset || s.replica} @ ${short(s.version)}`).join(", ");
    const replica = [...new Set(j.sources.map((s) => s.cluster || s.replica))].join(", ");
    return el("tr", { "data-job-id": j.id },
      el("td", { class: "nowrap", title: `${j.host} pid ${j.pid}` }, el("b", { text: j.name }), ` rank ${j.rank}/${j.world_size}`),
      el("td", { class: "mono ellip", text: reads, title: reads }),
      el("td", { class: "ellip", text: replica, title: j.sources.map((s) => s.replica).join(", ") }),
      el("td", { class: "num", text: j.position.toLocaleString() + ` (epoch ${j.epoch})` }),
      el("td", { class: "num", text: `${Math.round(j.samples_per_second).toLocaleString()}/s` }),
      el("td", {}, el("div", { class: "sla" + (share > STALL_BAD ? " miss" : "") },
        el("div", { class: "track", "aria-hidden": "true" }, el("div", { class: "fill", style: `width:${Math.min(1, share) * 100}%` })),
        el("span", { class: share > STALL_BAD ? "lag-bad" : "", text: `${(share * 100).toFixed(1)}%` }))),
      el("td", { class: "num", text: j.staged_ahead_bytes == null ? "—" : fmtBytes(j.staged_ahead_bytes) }),
      el("td", { class: "num", text: fmtAgo(j.last_seen) }));
  });
  $("jobs").tBodies[0].replaceChildren(...rows);
  $("jobs-empty").hidden = rows.length > 0;
  $("jobs-count").textContent = rows.length ? `(${rows.length})` : "";
}

// Throughput: our own SVG area chart; y scales to the max bucket, x spans the requested window.
function renderChart(tp) {
  const svg = $("chart");
  const W = 600, H = 180, padL = 4, padB = 18, padT = 14;
  const pts = tp.points;
  const ns = "http://www.w3.org/2000/svg";
  const mk = (tag, attrs) => { const e = document.createElementNS(ns, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); return e; };
  const max = Math.max(1, ...pts.map((p) => p.bps));
  const x = (i) => padL + ((W - padL * 2) * i) / Math.max(1, pts.length - 1);
  const y = (v) => H - padB - ((H - padB - padT) * v) / max;
  const kids = [];
  for (const f of [0, 0.5, 1]) kids.push(mk("line", { class: "grid", x1: 0, x2: W, y1: y(max * f), y2: y(max * f) }));
  if (pts.length) {
    const line = pts.map((p, i) => `${i ? "L" : "M"}${x(i).toFixed(1)},${y(p.bps).toFixed(1)}`).join("");
    kids.push(mk("path", { class: "area", d: `${line}L${x(pts.length - 1)},${y(0)}L${x(0)},${y(0)}Z` }));
    kids.push(mk("path", { class: "line", d: line }));
  }
  const label = (txt, xx, yy, anchor) => { const t = mk("text", { x: xx, y: yy, "text-anchor": anchor }); t.textContent = txt; return t; };
  kids.push(label(fmtRate(max), W - 4, padT - 2, "end"));
  const span = tp.bucket_seconds * pts.length;
  kids.push(label(`−${Math.round(span / 60)} min`, 4, H - 4, "start"), label("now", W - 4, H - 4, "end"));
  svg.replaceChildren(...kids);
  const last = pts.length ? pts[pts.length - 1].bps : 0;
  const avg = pts.length ? pts.reduce((a, p) => a + p.bps, 0) / pts.length : 0;
  $("chart-desc").textContent = `now ${fmtRate(last)} · peak ${fmtRate(max === 1 ? 0 : max)} · average ${fmtRate(avg)}`;
}

// ---------- data loading ----------
const loaders = {
  status: async () => renderStatus(await api("/status")),
  replicas: async () => renderMatrix(await api("/replicas")),
  transfers: async () => renderTransfers(await api("/transfers")),
  links: async () => renderLinks(await api("/links")),
  errors: async () => renderErrors(await api("/errors?limit=50")),
  jobs: async () => renderJobs(await api("/jobs")),
  chart: async () => {
    // the last hour, or less while the daemon is younger (5-minute steps) so early traffic is not a sliver
    const up = state.status?.uptime_seconds ?? 3600;
    const seconds = Math.min(3600, Math.max(300, Math.ceil(up / 300) * 300));
    $("chart-window").textContent = seconds === 3600 ? "last hour" : `last ${seconds / 60} min`;
    renderChart(await api(`/throughput?seconds=${seconds}&buckets=120`));
  },
};
let readDenied = false;
async function refresh(names) {
  const results = await Promise.allSettled(names.map((n) => loaders[n]()));
  const denied = results.find((r) => r.status === "rejected" && (r.reason?.status === 401 || r.reason?.status === 403));
  if (denied && !readDenied) {
    readDenied = true;
    forgetToken();
    if (await askToken("This service protects reading too: enter the API token.")) { readDenied = false; await refresh(Object.keys(loaders)); connect(); }
  }
}
// Coalesce bursts of events into at most one refresh per name every 400 ms.
const dirty = new Set();
let flushTimer = null;
function schedule(...names) {
  names.forEach((n) => dirty.add(n));
  if (!flushTimer) flushTimer = setTimeout(() => { flushTimer = null; const n = [...dirty]; dirty.clear(); refresh(n); }, 400);
}

// ---------- Server-Sent Events over fetch (so the Authorization header can be sent) ----------
let streamAbort = null;
function setConn(ok, text) {
  state.connected = ok;
  const c = $("conn");
  c.textContent = text;
  c.className = "pill " + (ok ? "pill-ok" : "pill-bad");
}
async function connect() {
  if (streamAbort) streamAbort.abort();
  const ctrl = new AbortController();
  streamAbort = ctrl;
  let delay = 500;
  while (!ctrl.signal.aborted) {
    try {
      const headers = { Accept: "text/event-stream" };
      if (state.token) headers.Authorization = "Bearer " + state.token;
      const r = await fetch(API + "/events", { headers, signal: ctrl.signal, cache: "no-store" });
      if (!r.ok || !r.body) throw new HttpError(r.status, "event stream: " + r.status);
      setConn(true, "live");
      delay = 500;
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const frame = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let kind = "message", data = "";
          for (const line of frame.split("\n")) {
            if (line.startsWith("event:")) kind = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trim();
          }
          if (data) { try { onEvent(kind, JSON.parse(data)); } catch (e) { console.error(e); } }
        }
      }
      throw new Error("stream ended");
    } catch (e) {
      if (ctrl.signal.aborted) return;
      setConn(false, "reconnecting…");
      await new Promise((res) => setTimeout(res, delay));
      delay = Math.min(delay * 2, 5000);
      if (!ctrl.signal.aborted) schedule(...Object.keys(loaders));
    }
  }
}
function onEvent(kind, d) {
  switch (kind) {
    case "hello": renderStatus(d.status); schedule(...Object.keys(loaders)); break;
    case "progress": {
      const t = state.transfers.get(transferKey(d));  // progress events carry the TransferOut names
      if (t) { t.bytes_done = d.bytes_done; t.bytes_total = d.bytes_total; t.rate_bps = d.rate_bps; drawTransfers(); }
      else schedule("transfers");
      break;
    }
    case "shard_verified": state.transfers.delete(transferKey(d)); drawTransfers();
      schedule("replicas", "transfers", "status"); break;
    case "version_published": case "pass": schedule("replicas", "links", "status", "transfers"); break;
    case "error": schedule("errors", "replicas", "transfers", "status"); break;
    case "scrub": schedule("replicas", "errors"); break;
    case "state": schedule("status", "links", "replicas"); break;
    case "resync": schedule(...Object.keys(loaders)); break;
    default: break;
  }
}

// ---------- controls ----------
function mib(v) { const n = parseFloat(v); return Number.isFinite(n) && n > 0 ? n * 1048576 : 0; }
function openLimits() {
  const lim = state.limits || { global_bps: null, links: {}, transfers: 4 };
  $("lim-global").value = lim.global_bps ? +(lim.global_bps / 1048576).toFixed(3) : "";
  $("lim-transfers").value = lim.transfers;
  const box = $("lim-links");
  const names = new Set([...state.links.map((l) => `${l.source}->${l.destination}`), ...Object.keys(lim.links || {})]);
  box.replaceChildren(...[...names].map((n) => el("label", {}, `Link ${n.replace("->", " → ")}`,
    el("input", { type: "number", min: "0", step: "any", "data-link": n,
      value: lim.links?.[n] ? +(lim.links[n] / 1048576).toFixed(3) : "" }))));
  const d = $("limits-dialog");
  $("limits-form").onsubmit = async (ev) => {
    ev.preventDefault();
    d.close();
    const links = {};
    box.querySelectorAll("input[data-link]").forEach((i) => { links[i.dataset.link] = mib(i.value); });
    const body = { global_bps: mib($("lim-global").value), links };
    const tr = parseInt($("lim-transfers").value, 10);
    if (tr >= 1) body.transfers = tr;
    if (await control("Limits", "/limits", "PUT", body)) schedule("status", "links");
  };
  $("limits-cancel").onclick = () => d.close();
  d.showModal();
  $("lim-global").focus();
}

document.addEventListener("DOMContentLoaded", () => {
  $("btn-pause").addEventListener("click", async () => {
    const paused = state.status?.paused;
    if (await control(paused ? "Resume" : "Pause", paused ? "/resume" : "/pause", "POST")) await refresh(["status", "replicas"]);
  });
  $("btn-sync").addEventListener("click", async () => { if (await control("Sync", "/sync", "POST", {})) schedule("status"); });
  $("btn-limits").addEventListener("click", openLimits);
  $("btn-token").addEventListener("click", async () => {
    forgetToken();
    if (await askToken("Enter the API token.")) { toast("token set"); readDenied = false; refresh(Object.keys(loaders)); connect(); }
  });
  $("btn-retry-all").addEventListener("click", async () => { if (await control("Retry all", "/retry", "POST", {})) schedule("errors", "replicas"); });
  refresh(Object.keys(loaders));
  connect();
  // a safety net for changes that raise no event (a dataset planned while paused), and lag and
  // "x ago" grow without events; the server caches these reads, so polling costs little
  setInterval(() => schedule("replicas", "transfers", "errors", "status", "jobs"), 3000);
  setInterval(() => schedule("links", "chart"), 10000);
});
