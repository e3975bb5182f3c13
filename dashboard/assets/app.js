// The GMA dashboard page: one EventSource on /api/events, plain DOM, hand-written canvas charts.
// Nothing is fetched from anywhere but this dashboard.
'use strict';

const METRICS = ['cpu', 'mem', 'net', 'load'];
const LABELS = { cpu: 'CPU', mem: 'memory', net: 'network', load: 'load1' };
const FIXED_MAX = { cpu: 100, mem: 100 };
const MAX_DECISIONS = 50;
const MAX_LATENCY_SAMPLES = 20000;

const state = {
  records: new Map(),   // "producer:id" -> record (+ receivedAt)
  hosts: new Map(),     // host -> { el, series: [{ points, canvas, valueEl, el, dirty, live }] }
  rpc: new Map(),       // source -> row element
  federation: new Map(), // "site peer" -> row element
  jobs: new Map(),      // "source job" -> { row, job }
  history: 120,
  archiver: false,
};

// Measurements the browser test reads: ms from an event's timestamp to the moment its chart
// and value were updated on the page (only for points that arrived live).
window.gmaLatency = [];
window.gmaStats = { messages: 0, snapshots: 0, points: 0, frames: 0 };
window.gmaState = state;

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-')) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c);
  return e;
}

function fmtAge(ms) {
  const s = Math.floor(ms / 1000);
  if (s < 60) return s + 's';
  const m = Math.floor(s / 60);
  if (m < 60) return m + 'm ' + (s % 60) + 's';
  const h = Math.floor(m / 60);
  if (h < 48) return h + 'h ' + (m % 60) + 'm';
  return Math.floor(h / 24) + 'd ' + (h % 24) + 'h';
}

function fmtBytes(v) {
  const units = ['B/s', 'KB/s', 'MB/s', 'GB/s'];
  let i = 0;
  while (Math.abs(v) >= 1000 && i < units.length - 1) { v /= 1000; i++; }
  return v.toFixed(v >= 100 ? 0 : 1) + ' ' + units[i];
}

function fmtValue(metric, v) {
  if (v === null || v === undefined || !isFinite(v)) return '–';
  if (metric === 'cpu' || metric === 'mem') return v.toFixed(1) + ' %';
  if (metric === 'net') return fmtBytes(v);
  return v.toFixed(2);
}

function fmtNum(v, digits) {
  if (v === null || v === undefined || !isFinite(v)) return '–';
  return digits === undefined ? String(v) : Number(v).toFixed(digits);
}

function fmtTime(ms) {
  return new Date(ms).toLocaleTimeString();
}

// ---- connection -------------------------------------------------------------------------

function setConn(text, cls) {
  const b = $('#conn');
  b.textContent = text;
  b.className = 'badge ' + (cls || '');
}

function connect() {
  const es = new EventSource('/api/events');
  es.onopen = () => setConn('live', 'ok');
  // EventSource reconnects by itself; the dashboard then sends a fresh snapshot.
  es.onerror = () => setConn('reconnecting…', 'bad');
  es.onmessage = (ev) => {
    window.gmaStats.messages++;
    let m;
    try { m = JSON.parse(ev.data); } catch (e) { return; }
    handle(m);
  };
}

function handle(m) {
  switch (m.type) {
    case 'snapshot': applySnapshot(m); break;
    case 'record':
      if (m.op === 'put') putRecord(m.record);
      else deleteRecord(m.kind, m.id);
      break;
    case 'cluster': renderCluster(m.cluster); break;
    case 'points':
      for (const p of m.points) addPoint(p[0], p[1], p[2], p[3], true);
      scheduleFrame();
      break;
    case 'hosts_gone':
      for (const h of m.hosts || []) removeHost(h);
      for (const s of m.rpc_sources || []) removeRpc(s);
      break;
    case 'decision': addDecision(m.decision, true); break;
    case 'rpc': for (const r of m.rows) putRpc(r); break;
    case 'federation': for (const r of m.rows) putFederation(r); break;
    case 'job': putJob(m.job); break;
    case 'hierarchy': renderHierarchy(m.trees); break;
    case 'status': renderStatus(m.status); break;
  }
}

function applySnapshot(s) {
  window.gmaStats.snapshots++;
  state.history = s.history || 120;
  state.archiver = !!s.archiver;
  // A snapshot replaces everything (first connect, reconnect, or after lagging).
  state.records.clear();
  $('#producers tbody').replaceChildren();
  $('#consumers tbody').replaceChildren();
  for (const r of s.records) putRecord(r);
  renderCluster(s.cluster);
  state.hosts.clear();
  $('#hosts').replaceChildren();
  for (const h of s.hosts) {
    for (const m of METRICS) {
      for (const p of (h.series[m] || [])) addPoint(h.host, m, p[0], p[1], false);
    }
  }
  $('#decisions').replaceChildren();
  for (const d of s.decisions) addDecision(d, false);
  state.rpc.clear();
  $('#rpc tbody').replaceChildren();
  for (const r of s.rpc) putRpc(r);
  state.federation.clear();
  $('#federation tbody').replaceChildren();
  for (const r of (s.federation || [])) putFederation(r);
  resetJobs(s.jobs || []);
  renderHierarchy(s.hierarchy || []);
  renderStatus(s.status || {});
  $('#history-section').hidden = !state.archiver;
  if (state.archiver) loadArchiveSeries();
  scheduleFrame();
  updateCounts();
}

function renderStatus(st) {
  const b = $('#banner');
  const errs = Object.entries(st || {}).filter(([, v]) => v);
  b.hidden = errs.length === 0;
  b.textContent = errs.map(([k, v]) => k + ' unreachable: ' + v).join('; ');
}

// ---- directory records ------------------------------------------------------------------

function recordKey(kind, id) { return kind + ':' + id; }

function putRecord(r) {
  r.receivedAt = Date.now();
  state.records.set(recordKey(r.kind, r.id), r);
  const body = $(r.kind === 'producer' ? '#producers tbody' : '#consumers tbody');
  let row = body.querySelector(`tr[data-id="${CSS.escape(r.id)}"]`);
  const cells = r.kind === 'producer'
    ? [r.id, r.address, r.events.join(', ') + (r.n_events > r.events.length ? ' …' : ''), String(r.n_sources), r.site]
    : [r.id, r.address, r.manner, r.events.join(', '), r.site];
  const fresh = el('tr', { 'data-id': r.id, 'data-kind': r.kind },
    ...cells.map((c) => el('td', {}, c)),
    el('td', { class: 'age' }, ''));
  if (row) row.replaceWith(fresh); else insertSorted(body, fresh, r.id);
  renderAge(fresh, r);
  updateCounts();
}

function insertSorted(parent, node, key) {
  for (const c of parent.children) {
    if ((c.dataset.id || c.dataset.host || '') > key) { parent.insertBefore(node, c); return; }
  }
  parent.append(node);
}

function deleteRecord(kind, id) {
  state.records.delete(recordKey(kind, id));
  const body = $(kind === 'producer' ? '#producers tbody' : '#consumers tbody');
  const row = body.querySelector(`tr[data-id="${CSS.escape(id)}"]`);
  if (row) row.remove();
  updateCounts();
}

function renderAge(row, r) {
  const age = r.age_ms + (Date.now() - r.receivedAt);
  row.querySelector('.age').textContent = (r.before_start ? '≥ ' : '') + fmtAge(age);
}

function tickAges() {
  for (const r of state.records.values()) {
    const body = $(r.kind === 'producer' ? '#producers tbody' : '#consumers tbody');
    const row = body.querySelector(`tr[data-id="${CSS.escape(r.id)}"]`);
    if (row) renderAge(row, r);
  }
}

function updateCounts() {
  const p = $('#producers tbody').children.length;
  const c = $('#consumers tbody').children.length;
  $('#producer-count').textContent = '(' + p + ')';
  $('#consumer-count').textContent = '(' + c + ')';
  $('#host-count').textContent = '(' + state.hosts.size + ')';
  $('#summary').textContent = p + ' producers, ' + c + ' consumers, ' + state.hosts.size + ' hosts';
}

// ---- cluster ----------------------------------------------------------------------------

function renderCluster(c) {
  const body = $('#cluster tbody');
  body.replaceChildren();
  if (!c) return;
  if (c.error) {
    $('#cluster-summary').textContent = 'ClusterStatus failed: ' + c.error;
    return;
  }
  $('#cluster-summary').textContent = 'leader ' + (c.leader_id || 'none') + ', term ' + c.term +
    ', revision ' + c.revision + ', ' + c.producers + ' producers, ' + c.consumers + ' consumers, ' +
    c.leases + ' leases, ' + c.schemas + ' schemas';
  for (const m of c.members) {
    const role = (m.leader ? '★ leader' : (m.voter ? 'voter' : 'learner'));
    body.append(el('tr', { 'data-member': String(m.id), class: m.leader ? 'leader' : '' },
      el('td', {}, String(m.id)), el('td', {}, m.address), el('td', {}, role),
      el('td', {}, m.state || '–'), el('td', { class: 'num' }, m.last_applied == null ? '–' : String(m.last_applied)),
      el('td', { class: m.reachable ? '' : 'err' }, m.reachable ? 'yes' : ('no' + (m.error ? ': ' + m.error : '')))));
  }
}

// ---- hosts and charts -------------------------------------------------------------------

function ensureHost(host) {
  let h = state.hosts.get(host);
  if (h) return h;
  const card = el('div', { class: 'host', 'data-host': host }, el('h3', {}, host));
  const series = METRICS.map((m) => {
    const canvas = el('canvas', { width: 160, height: 26 });
    const valueEl = el('span', { class: 'value' }, '–');
    const row = el('div', { class: 'metric', 'data-metric': m }, el('span', { class: 'label' }, LABELS[m]), canvas, valueEl);
    card.append(row);
    return { metric: m, points: [], canvas, valueEl, el: row, dirty: false, live: [] };
  });
  h = { el: card, series };
  state.hosts.set(host, h);
  insertSorted($('#hosts'), card, host);
  updateCounts();
  return h;
}

function removeHost(host) {
  const h = state.hosts.get(host);
  if (!h) return;
  h.el.remove();
  state.hosts.delete(host);
  updateCounts();
}

function addPoint(host, metric, t, v, live) {
  const i = METRICS.indexOf(metric);
  if (i < 0) return;
  const s = ensureHost(host).series[i];
  const last = s.points[s.points.length - 1];
  if (last && t <= last[0]) return; // already have it (snapshot overlap)
  s.points.push([t, v]);
  while (s.points.length > state.history) s.points.shift();
  s.dirty = true;
  if (live) s.live.push(t);
  window.gmaStats.points++;
}

let frameRequested = false;
function scheduleFrame() {
  if (frameRequested) return;
  frameRequested = true;
  requestAnimationFrame(drawFrame);
}

function drawFrame() {
  frameRequested = false;
  const stamps = [];
  for (const h of state.hosts.values()) {
    for (const s of h.series) {
      if (!s.dirty) continue;
      s.dirty = false;
      drawSpark(s);
      const last = s.points[s.points.length - 1];
      s.valueEl.textContent = fmtValue(s.metric, last[1]);
      s.el.dataset.v = last[1] === null ? 'NaN' : String(last[1]);
      s.el.dataset.t = String(last[0]);
      s.el.dataset.n = String(s.points.length);
      for (const t of s.live) stamps.push(t);
      s.live.length = 0;
    }
  }
  // The DOM and the canvases hold the new values now.
  const now = Date.now();
  const lat = window.gmaLatency;
  for (const t of stamps) lat.push(now - t);
  if (lat.length > MAX_LATENCY_SAMPLES) lat.splice(0, lat.length - MAX_LATENCY_SAMPLES);
  window.gmaStats.frames++;
}

function drawSpark(s) {
  const c = s.canvas;
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(10, Math.round(c.clientWidth * dpr) || c.width);
  const hgt = Math.max(10, Math.round(c.clientHeight * dpr) || c.height);
  if (c.width !== w) c.width = w;
  if (c.height !== hgt) c.height = hgt;
  const ctx = c.getContext('2d');
  ctx.clearRect(0, 0, w, hgt);
  const pts = s.points.filter((p) => p[1] !== null && isFinite(p[1]));
  if (pts.length === 0) return;
  const t0 = pts[0][0];
  const t1 = Math.max(pts[pts.length - 1][0], t0 + 1);
  let max = FIXED_MAX[s.metric];
  if (max === undefined) {
    max = 0;
    for (const p of pts) max = Math.max(max, p[1]);
    max = max > 0 ? max * 1.15 : 1;
  }
  const x = (t) => ((t - t0) / (t1 - t0)) * (w - 2) + 1;
  const y = (v) => hgt - 1 - (Math.min(Math.max(v, 0), max) / max) * (hgt - 2);
  ctx.beginPath();
  ctx.moveTo(x(pts[0][0]), y(pts[0][1]));
  for (const p of pts) ctx.lineTo(x(p[0]), y(p[1]));
  ctx.strokeStyle = '#4fb3ff';
  ctx.lineWidth = 1.5 * dpr;
  ctx.stroke();
  ctx.lineTo(x(pts[pts.length - 1][0]), hgt);
  ctx.lineTo(x(pts[0][0]), hgt);
  ctx.closePath();
  ctx.fillStyle = 'rgba(79,179,255,0.15)';
  ctx.fill();
}

// ---- decisions and gma.rpc --------------------------------------------------------------

function addDecision(d, live) {
  const v = d.values || {};
  const what = v.decision || v.outcome || '';
  const subject = v.app_id || v.job_id || v.job || '';
  const parts = [fmtTime(d.t_ms), d.name, 'from', d.source + ':'];
  const li = el('li', { 'data-name': d.name },
    parts.join(' ') + ' ',
    el('b', { class: what }, what || '(event)'),
    subject ? ' ' + subject : '',
    v.target_hosts ? ' → ' + v.target_hosts : '',
    (typeof v.gain === 'number') ? ' gain ' + v.gain.toFixed(3) : '',
    v.reason ? ' — ' + v.reason : '');
  const list = $('#decisions');
  list.prepend(li);
  while (list.children.length > MAX_DECISIONS) list.lastChild.remove();
  if (live) li.style.background = '#233';
}

function putRpc(r) {
  const body = $('#rpc tbody');
  const instance = r.source.endsWith('/' + r.method) ? r.source.slice(0, -r.method.length - 1) : r.source;
  const row = el('tr', { 'data-id': r.source },
    el('td', {}, r.role), el('td', {}, instance), el('td', {}, r.method),
    el('td', { class: 'num' }, fmtNum(r.requests)), el('td', { class: 'num' + (r.errors > 0 ? ' err' : '') }, fmtNum(r.errors)),
    el('td', { class: 'num' }, fmtNum(r.p50_ms, 2)), el('td', { class: 'num' }, fmtNum(r.p99_ms, 2)),
    el('td', { class: 'num' }, fmtNum(r.max_ms, 2)), el('td', { class: 'num' }, fmtNum(r.total_requests)));
  const old = state.rpc.get(r.source);
  if (old && old.isConnected) old.replaceWith(row); else insertSorted(body, row, r.source);
  state.rpc.set(r.source, row);
}

function putFederation(r) {
  const v = r.values || {};
  const key = r.site + ' ' + (v.peer || '');
  const row = el('tr', { 'data-id': key },
    el('td', {}, r.site), el('td', {}, v.peer || ''),
    el('td', { class: v.live === 1 ? '' : 'err' }, v.live === 1 ? 'live' : 'expired'),
    el('td', { class: 'num' }, fmtNum(v.summary_age_ms)), el('td', { class: 'num' }, fmtNum(v.forwarded_out)),
    el('td', { class: 'num' }, fmtNum(v.forwarded_in)), el('td', { class: 'num' }, fmtNum(v.cpus_free_sum)));
  const old = state.federation.get(key);
  if (old && old.isConnected) old.replaceWith(row); else insertSorted($('#federation tbody'), row, key);
  state.federation.set(key, row);
}

// ---- batch jobs (job.batch) -------------------------------------------------------------

// Finished jobs kept on the page (the dashboard keeps MAX_FINISHED_JOBS for new browsers).
const MAX_FINISHED_JOBS = 100;
const JOB_DONE = ['completed', 'failed', 'cancelled'];

function resetJobs(jobs) {
  state.jobs.clear();
  $('#jobs tbody').replaceChildren();
  for (const j of jobs) putJob(j);
}

function jobRuntime(j) {
  if (!(j.start_s > 0)) return '–';
  const end = j.end_s > 0 ? j.end_s * 1000 : Date.now();
  return fmtAge(Math.max(0, end - j.start_s * 1000));
}

function jobRow(j) {
  const done = JOB_DONE.includes(j.state);
  const exit = done ? fmtNum(j.exit_code) + (j.signal > 0 ? ' (signal ' + j.signal + ')' : '') : '';
  return el('tr', { 'data-id': j.source + ' ' + j.job, 'data-state': j.state, class: j.state + (done ? ' finished' : ''), title: j.reason || '' },
    el('td', {}, j.job), el('td', {}, j.name), el('td', { class: 'state' }, j.state),
    el('td', {}, j.resource), el('td', {}, j.reservation), el('td', {}, j.owner),
    el('td', {}, j.start_s > 0 ? fmtTime(j.start_s * 1000) : '–'),
    el('td', { class: 'num runtime' }, jobRuntime(j)),
    el('td', { class: 'num' + (done && j.exit_code !== 0 ? ' err' : '') }, exit),
    el('td', {}, j.source));
}

// Active jobs first (pending, running), then finished ones, newest first.
function jobKey(j) {
  const done = JOB_DONE.includes(j.state);
  return (done ? '1' : '0') + String(1e12 - Math.floor(j.t_ms || 0)).padStart(14, '0') + j.source + ' ' + j.job;
}

function putJob(j) {
  const key = j.source + ' ' + j.job;
  const old = state.jobs.get(key);
  if (old) old.row.remove();
  const row = jobRow(j);
  row.dataset.key = jobKey(j);
  const body = $('#jobs tbody');
  const next = [...body.children].find((c) => c.dataset.key > row.dataset.key);
  if (next) body.insertBefore(row, next); else body.append(row);
  state.jobs.set(key, { row, job: j });
  const finished = [...state.jobs.entries()].filter(([, v]) => JOB_DONE.includes(v.job.state));
  finished.sort((a, b) => a[1].job.t_ms - b[1].job.t_ms);
  for (const [k, v] of finished.slice(0, Math.max(0, finished.length - MAX_FINISHED_JOBS))) {
    v.row.remove();
    state.jobs.delete(k);
  }
  updateJobCount();
}

function updateJobCount() {
  let running = 0, pending = 0;
  for (const v of state.jobs.values()) {
    if (v.job.state === 'running') running++;
    else if (v.job.state === 'pending') pending++;
  }
  $('#job-count').textContent = running + ' running, ' + pending + ' pending';
}

// Running jobs' runtimes move on between events.
function tickJobs() {
  for (const v of state.jobs.values()) {
    if (v.job.state === 'running') v.row.querySelector('.runtime').textContent = jobRuntime(v.job);
  }
}

// The hierarchy panel: the tree around each configured federation endpoint (superiors first,
// then each manager with its inferiors), link health as seen from the superior, free CPUs.
function linkHealth(link) {
  if (!link) return '';
  const heard = link.heard_ms_ago === null || link.heard_ms_ago === undefined ? 'never' : link.heard_ms_ago + ' ms ago';
  return el('span', { class: link.live ? 'ok' : 'err' },
    ' [link ' + (link.live ? 'up' : 'down') + ', ' + (link.session || '') + ', last reply ' + heard +
    (link.last_error ? ', ' + link.last_error : '') + ']');
}

function hierarchyNode(n) {
  const link = n.link;
  const free = n.reachable
    ? ' own ' + fmtNum(n.own_cpus_free) + ' free CPUs, subtree ' + fmtNum(n.subtree_cpus_free) + ' free CPUs'
    : ' unreachable (' + (n.error || '') + '); subtree ' + fmtNum(n.subtree_cpus_free) + ' free CPUs as last advertised';
  const li = el('li', { 'data-site': n.site || '', 'data-subtree-free': String(n.subtree_cpus_free),
                        'data-link': link ? (link.live ? 'up' : 'down') : 'root' },
    el('b', {}, n.site || ''), ' ' + (n.endpoint || ''), free, linkHealth(link));
  const kids = n.inferiors || [];
  if (kids.length) li.append(el('ul', {}, ...kids.map(hierarchyNode)));
  return li;
}

function renderHierarchy(trees) {
  const box = $('#hierarchy');
  box.replaceChildren();
  if (!trees.length) {
    box.append(el('p', { class: 'muted' }, 'no federation endpoint configured (gma dashboard --federation ADDR)'));
    return;
  }
  for (const t of trees) {
    if (t.error) { box.append(el('p', { class: 'err' }, (t.endpoint || '') + ': ' + t.error)); continue; }
    const ul = el('ul', { class: 'tree' });
    for (const s of [...(t.superiors || [])].reverse()) {
      ul.append(el('li', { class: 'superior', 'data-site': s.site || '' },
        '^ ', el('b', {}, s.site || ''), ' ' + (s.endpoint || '') + ' superior of ' + (s.below || ''), linkHealth(s.link)));
    }
    ul.append(hierarchyNode(t.root));
    box.append(ul);
  }
}

function removeRpc(source) {
  const row = state.rpc.get(source);
  if (row) row.remove();
  state.rpc.delete(source);
}

// ---- history (archiver) -----------------------------------------------------------------

let seriesLoaded = false;
async function loadArchiveSeries() {
  if (seriesLoaded) return;
  seriesLoaded = true;
  try {
    const r = await fetch('/api/archive/series');
    const j = await r.json();
    const names = new Set(), sources = new Set(), fields = new Set();
    for (const s of j.series || []) { names.add(s.name); sources.add(s.source); fields.add(s.field); }
    const fill = (id, set) => $(id).replaceChildren(...[...set].sort().map((v) => el('option', { value: v })));
    fill('#h-names', names); fill('#h-sources', sources); fill('#h-fields', fields);
  } catch (e) { seriesLoaded = false; }
}

async function showHistory(ev) {
  ev.preventDefault();
  const q = new URLSearchParams({
    name: $('#h-name').value.trim(), source: $('#h-source').value.trim(),
    field: $('#h-field').value.trim(), range_s: $('#h-range').value,
  });
  const status = $('#history-status');
  status.textContent = 'querying the archiver…';
  try {
    const r = await fetch('/api/history?' + q);
    const j = await r.json();
    if (!r.ok) { status.textContent = 'error: ' + j.error; return; }
    drawHistory(j);
    const n = j.series.reduce((a, s) => a + s.t.length, 0);
    status.textContent = j.series.length + ' series, ' + n + ' points (mean per ' + (j.step_ms / 1000) + ' s)';
  } catch (e) { status.textContent = 'error: ' + e; }
}

const PALETTE = ['#4fb3ff', '#3ecf8e', '#f5b94f', '#ff6b6b', '#c792ea', '#89ddff', '#ffcb6b', '#f78c6c'];

function drawHistory(j) {
  const c = $('#history-chart');
  const dpr = window.devicePixelRatio || 1;
  const w = Math.round(c.clientWidth * dpr) || c.width, h = Math.round(c.clientHeight * dpr) || c.height;
  c.width = w; c.height = h;
  const ctx = c.getContext('2d');
  ctx.clearRect(0, 0, w, h);
  let min = Infinity, max = -Infinity;
  for (const s of j.series) for (const v of s.v) if (v !== null) { min = Math.min(min, v); max = Math.max(max, v); }
  ctx.fillStyle = '#7d8894';
  ctx.font = (11 * dpr) + 'px sans-serif';
  if (!isFinite(min)) { ctx.fillText('no data in this range', 10 * dpr, 20 * dpr); return; }
  if (max === min) { max += 1; min -= 1; }
  const left = 50 * dpr, bottom = h - 20 * dpr, top = 10 * dpr, right = w - 10 * dpr;
  const x = (t) => left + ((t - j.from_ms) / (j.to_ms - j.from_ms)) * (right - left);
  const y = (v) => bottom - ((v - min) / (max - min)) * (bottom - top);
  ctx.fillText(max.toPrecision(4), 2, top + 8 * dpr);
  ctx.fillText(min.toPrecision(4), 2, bottom);
  ctx.fillText(fmtTime(j.from_ms), left, h - 4 * dpr);
  ctx.fillText(fmtTime(j.to_ms), right - 60 * dpr, h - 4 * dpr);
  j.series.forEach((s, k) => {
    ctx.beginPath();
    let pen = false;
    s.t.forEach((t, i) => {
      const v = s.v[i];
      if (v === null) { pen = false; return; }
      if (pen) ctx.lineTo(x(t), y(v)); else ctx.moveTo(x(t), y(v));
      pen = true;
    });
    ctx.strokeStyle = PALETTE[k % PALETTE.length];
    ctx.lineWidth = 1.5 * dpr;
    ctx.stroke();
    ctx.fillStyle = PALETTE[k % PALETTE.length];
    ctx.fillText(s.source + ' ' + s.field, left + 8 * dpr, top + (12 + 12 * k) * dpr);
  });
}

$('#history-form').addEventListener('submit', showHistory);
setInterval(tickAges, 1000);
setInterval(tickJobs, 1000);
connect();
