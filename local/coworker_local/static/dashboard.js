// Coworker local dashboard: plain JavaScript, no external scripts (the machine may be offline).
// Reads the task API (/stats, /tasks, /batches/{id}, /tasks/{key}) and the runtime's /local/info
// every REFRESH_MS and redraws.
"use strict";

const REFRESH_MS = 1500;
const WINDOW_SECONDS = 300;
const FAILURE_ROWS = 10;
const STATUSES = ["todo", "processing", "failed", "finished", "ignored"];

const state = {
  selectedKey: null,
  extraBatches: new Set(),  // batch ids seen in listings
  lastOk: 0,
};

function $(id) { return document.getElementById(id); }

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}

function fmt(n) { return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"); }

function ago(iso) {
  if (!iso) return "";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${s.toFixed(0)} s ago`;
  if (s < 3600) return `${(s / 60).toFixed(0)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

async function getJSON(path) {
  const response = await fetch(path, {cache: "no-store", headers: {"Accept": "application/json"}});
  if (!response.ok) {
    const text = await response.text();
    const error = new Error(`${path}: HTTP ${response.status} ${text.slice(0, 200)}`);
    error.status = response.status;
    throw error;
  }
  return response.json();
}

// A listing route answers a page at a time: follow its cursor to the end, so that the panel shows
// every entry. An entry read twice (a schedule that fired while the pages were read moves on in
// the listing's order) is shown once, as last read.
async function getAllPages(path, field, keyOf) {
  const entries = new Map();
  let answer = null;
  let cursor = null;
  do {
    const separator = path.includes("?") ? "&" : "?";
    answer = await getJSON(cursor ? `${path}${separator}cursor=${encodeURIComponent(cursor)}` : path);
    for (const entry of answer[field] || []) entries.set(keyOf(entry), entry);
    cursor = answer.cursor;
  } while (cursor);
  return {...answer, [field]: [...entries.values()], cursor: null};
}

const allTypes = () => getAllPages("/types?limit=100", "types", t => t.type);
const allRates = () => getAllPages("/rate-limits?limit=100", "limits", r => r.group);
const allSchedules = () => getAllPages("/schedules?limit=100", "schedules", s => s.name)
  .then(answer => ({...answer, schedules: answer.schedules.sort((a, b) => a.name < b.name ? -1 : a.name > b.name ? 1 : 0)}));

// ---- counts -------------------------------------------------------------------------------

function renderCounts(stats, info) {
  const counts = (stats && stats.counts) || {};
  const notes = [];
  for (const status of STATUSES) {
    const entry = counts[status];
    let text = "–";
    if (entry && entry.count !== null && entry.count !== undefined) {
      text = fmt(entry.count) + (entry.capped ? "+" : "");
    } else if (status === "finished" && info) {
      // Finished tasks leave the status index, so the API does not count them; the local runtime
      // counts them in its table (a scan on a thread of its own: a large table's count is older).
      const age = info.finished_tasks_age_seconds;
      text = info.finished_tasks === null ? "counting…" : fmt(info.finished_tasks);
      notes.push("finished: counted by the local runtime (finished tasks leave the status index)"
        + (age !== null && age !== undefined && age >= 10 ? `, ${duration(age)} ago` : ""));
    }
    $("count-" + status).textContent = text;
  }
  notes.unshift("todo, processing, failed, ignored: counted by GET /stats from the status index");
  $("counts-note").textContent = notes.join(" · ");
  $("counts-note").title = (stats && stats.note) || "";
}

// ---- backlog ------------------------------------------------------------------------------

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 90) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
  if (seconds < 5400) return `${(seconds / 60).toFixed(0)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function renderBacklog(info) {
  const backlog = info && info.backlog;
  const tick = info && info.last_tick;
  const capped = new Set((backlog && backlog.capped) || []);
  const shown = (value, name) => backlog ? fmt(value) + (capped.has(name) ? "+" : "") : "–";
  $("backlog-todo").textContent = shown(backlog && backlog.todo, "todo");
  $("backlog-retry").textContent = shown(backlog && backlog.retry, "retry");
  $("backlog-lost").textContent = backlog ? fmt(backlog.lost) : "–";
  $("backlog-running").textContent = tick ? fmt(tick.running_tasks) : "–";
  $("backlog-blocked").textContent = shown(backlog && backlog.blocked, "blocked");
  $("backlog-age").textContent = backlog ? duration(backlog.oldest_due_age_seconds) : "–";
  const settings = (info && info.settings) || {};
  $("backlog-age").parentElement.classList.toggle("warn", !!backlog && backlog.oldest_due_age_seconds > 60);
  $("backlog-note").textContent = backlog
    ? `measured ${ago(new Date(backlog.at * 1000).toISOString())} by the coordinator, every ${settings.backlog_seconds} s; ` +
      `counted up to ${fmt(settings.backlog_count_cap)} per status ("+" means at least)`
    : "waiting for the coordinator's first backlog measure";
}

// ---- throughput chart ---------------------------------------------------------------------

function drawChart(series) {
  const canvas = $("chart");
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 900, height = canvas.clientHeight || 220;
  if (canvas.width !== width * ratio) { canvas.width = width * ratio; canvas.height = height * ratio; }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);

  const now = Math.floor(Date.now() / 1000);
  const start = now - WINDOW_SECONDS;
  const bucket = 5;  // seconds per bar
  const bars = WINDOW_SECONDS / bucket;
  const data = Array.from({length: bars}, () => [0, 0, 0]);
  for (const [second, finished, failed, ignored] of series || []) {
    const index = Math.floor((second - start) / bucket);
    if (index < 0 || index >= bars) continue;
    data[index][0] += finished / bucket; data[index][1] += failed / bucket; data[index][2] += ignored / bucket;
  }
  const peak = Math.max(1, ...data.map(d => d[0] + d[1] + d[2]));
  const nice = 4 * niceCeil(peak / 4);  // four gridlines at round numbers
  const left = 40, right = 8, top = 8, bottom = 22;
  const plotW = width - left - right, plotH = height - top - bottom;

  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#667085"; ctx.strokeStyle = "#eceef2"; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = top + plotH - (plotH * i) / 4;
    ctx.beginPath(); ctx.moveTo(left, y + 0.5); ctx.lineTo(width - right, y + 0.5); ctx.stroke();
    ctx.textAlign = "right"; ctx.fillText(formatRate((nice * i) / 4), left - 6, y + 4);
  }
  ctx.textAlign = "center";
  for (let m = 0; m <= WINDOW_SECONDS / 60; m++) {
    const x = left + (plotW * (m * 60)) / WINDOW_SECONDS;
    const last = m === WINDOW_SECONDS / 60;
    ctx.textAlign = last ? "right" : m === 0 ? "left" : "center";
    ctx.fillText(last ? "now" : `-${WINDOW_SECONDS / 60 - m} min`, last ? width - right : x, height - 6);
  }
  const colors = [css("--finished"), css("--failed"), css("--ignored")];
  const barW = plotW / bars;
  data.forEach((values, i) => {
    let y = top + plotH;
    values.forEach((value, j) => {
      if (value <= 0) return;
      const h = (plotH * value) / nice;
      ctx.fillStyle = colors[j];
      ctx.fillRect(left + i * barW + 0.5, y - h, Math.max(1, barW - 1), h);
      y -= h;
    });
  });
  // Rate over the last 10 complete seconds.
  const recent = (series || []).filter(([s]) => s >= now - 10 && s < now);
  const rate = recent.reduce((sum, [, f, fa, ig]) => sum + f + fa + ig, 0) / 10;
  $("rate-now").textContent = `now: ${formatRate(rate)} outcomes/s`;
}

function niceCeil(value) {
  const exp = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 2.5, 5, 10]) if (value <= step * exp) return step * exp;
  return 10 * exp;
}

function formatRate(v) { return v >= 10 ? v.toFixed(0) : v.toFixed(1); }

function css(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }

// ---- runtime panel ------------------------------------------------------------------------

function renderRuntime(info) {
  if (!info) { $("runtime").innerHTML = '<dt>runtime</dt><dd>not available</dd>'; return; }
  const w = info.workers || {};
  const s = info.settings || {};
  const t = info.last_tick;
  const rows = [
    ["worker processes", `${fmt(w.running)} running · ${fmt(w.idle_environments)} warm · max ${fmt(w.max_invocations)}`],
    ["invocations", `${fmt(w.ok || 0)} ok · ${fmt(w["timeout-killed"] || 0)} killed at timeout · ${fmt(w.crashed || 0)} crashed · ${fmt(w.queued || 0)} queued`],
    ["cold starts", fmt(w.cold_starts || 0)],
    ...(info.runners && info.runners.started !== undefined ? [["container runners",
      `${fmt(info.runners.running)} running · ${fmt(info.runners.started)} started · max ${fmt(s.max_runners)}`
      + (info.runners.runners || []).filter(r => r.exit_code === null).map(r => ` · pid ${r.pid} ${r.seconds} s`).join("")]] : []),
    ["coordinator", t ? `tick ${fmt(info.ticks)}, the last ${info.last_tick_age_seconds} s ago · ${info.coordinator_state === "supervising" ? "holds the lease" : info.coordinator_state === "idle" ? "idle: nothing to do, looks again each tick" : info.coordinator_state} · busy slots ${t.busy_slots} · free ${t.free_slots} · due ${t.due} · started ${t.invocations}` : "waiting for the first tick"],
    ["settings", `concurrency ${s.max_concurrency} · batch ${s.batch_size} · tick ${s.tick_seconds} s · timeout ${s.worker_timeout_seconds} s · lock ${info.effective_lock_seconds} s · attempts ${s.max_attempts}`],
    ["uptime", `${fmt(Math.round(info.uptime_seconds))} s`],
  ];
  if ((info.tick_errors || []).length) rows.push(["tick errors", info.tick_errors.slice(-1)[0]]);
  // the table console (--console): dynamodb-admin on 127.0.0.1, the DynamoDB console's stand-in
  $("console-link").innerHTML = info.console
    ? ` · table <a href="${esc(info.console)}" target="_blank" rel="noopener">console</a>` : "";
  $("runtime").innerHTML = rows.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(v)}</dd>`).join("");
}

// ---- batches ------------------------------------------------------------------------------

async function renderBatches(info) {
  const ids = [...new Set([...(info ? info.batches : []), ...state.extraBatches])].slice(-8);
  if (!ids.length) {
    if (info) $("batches").innerHTML = '<div class="empty">no batches yet</div>';
    return;
  }
  // one request for the panel, whatever the number of batches
  const {items: batches} = await getJSON(`/local/batches?${ids.map(id => `id=${encodeURIComponent(id)}`).join("&")}`);
  const html = batches.map(b => {
    const total = Math.max(1, b.total);
    const pct = v => (100 * v / total).toFixed(2) + "%";
    const done = b.finished + b.ignored;
    return `<div class="batch" data-batch="${esc(b.batch_id)}">
      <div class="top"><span class="id">${esc(b.batch_id)}</span>
        <span>${fmt(done)} / ${fmt(b.total)} ${b.state === "failed" ? "· <b>failed</b>" : b.done ? "· done" : ""}</span></div>
      ${b.state === "failed" ? `<div class="note batch-failure">${esc(b.failure_reason)} — redrive: coworker retry --batch ${esc(b.batch_id)}</div>` : ""}
      <div class="bar" title="finished ${b.finished}, ignored ${b.ignored}, open ${b.open}">
        <span style="width:${pct(b.finished)};background:var(--finished)"></span>
        <span style="width:${pct(b.ignored)};background:var(--ignored)"></span>
      </div></div>`;
  }).join("");
  $("batches").innerHTML = html || '<div class="empty">no batches yet</div>';
}

// ---- recent failures ----------------------------------------------------------------------

async function loadFailures() {
  // one request: the latest failed and ignored tasks with their last error
  const {items} = await getJSON(`/local/failures?limit=${FAILURE_ROWS}`);
  for (const item of items) if (item.batch_id) state.extraBatches.add(item.batch_id);
  return items;
}

function renderFailures(items) {
  if (!items.length) {
    $("failures").innerHTML = '<tr><td colspan="6" class="empty">none yet</td></tr>';
    return;
  }
  $("failures").innerHTML = items.map(item => {
    const last = item.last_error;
    return `<tr class="clickable" data-key="${esc(item.key)}">
      <td class="kind nowrap" title="${esc(item.key)}">${esc(item.key)}</td><td class="nowrap" title="${esc(item.type)}">${esc(item.type)}</td>
      <td><span class="pill ${esc(item.status)}">${esc(item.status)}</span></td>
      <td class="num">${fmt(item.attempts)}/${fmt(item.max_attempts)}</td>
      <td class="msg" title="${esc(last ? last.message : "")}">${last ? `<span class="kind">${esc(last.kind)}</span> ${esc(last.message)}` : ""}</td>
      <td class="nowrap">${esc(ago(item.updated_at))}</td></tr>`;
  }).join("");
}

// ---- task detail --------------------------------------------------------------------------

async function renderDetail() {
  const key = state.selectedKey;
  if (!key) return;
  let task;
  try {
    task = await getJSON(`/tasks/${encodeURIComponent(key)}`);
  } catch (error) {
    $("detail").innerHTML = `<div class="empty">${esc(error.status === 404 ? `no task with key ${key}` : error.message)}</div>`;
    return;
  }
  const fields = [
    ["key", task.key], ["type", task.type], ["status", task.status],
    ["attempts", `${task.attempts} of ${task.max_attempts}`], ["batch", task.batch_id],
    ["created", task.created_at], ["updated", task.updated_at], ["due", task.due_at],
    ["started", task.started_at], ["finished", task.finished_at], ["lock owner", task.lock_owner], ["lock expires", task.lock_expires_at],
  ];
  const history = (task.errors || []).map(e => `<tr>
      <td class="num">${fmt(e.attempt)}</td><td class="kind">${esc(e.kind)}</td><td>${esc(e.at)}</td>
      <td>${esc(e.message)}${e.traceback ? `<details><summary>traceback</summary><pre>${esc(e.traceback)}</pre></details>` : ""}</td></tr>`).join("");
  $("detail").innerHTML = `
    <div style="display:grid;grid-template-columns:minmax(260px,1fr) 2fr;gap:20px">
      <dl class="kv" id="detail-fields">${fields.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${k === "status"
        ? `<span class="pill ${esc(v)}">${esc(v)}</span>` : esc(v ?? "–")}</dd>`).join("")}</dl>
      <div>
        <h2 style="margin-top:0">Error history</h2>
        ${history ? `<table id="detail-history"><thead><tr><th class="num">attempt</th><th>kind</th><th>at</th><th>message</th></tr></thead><tbody>${history}</tbody></table>`
                  : '<div class="empty" id="detail-history">no errors</div>'}
        <details open><summary>payload</summary><pre>${esc(JSON.stringify(task.payload, null, 2))}</pre></details>
        <details ${task.result !== null && task.result !== undefined ? "open" : ""}><summary>result</summary><pre>${esc(JSON.stringify(task.result, null, 2))}</pre></details>
      </div>
    </div>`;
}

function select(key) {
  state.selectedKey = key;
  $("lookup-key").value = key;
  renderDetail();
}

// ---- task types -----------------------------------------------------------------------------

function renderTypes(answer, force = false) {
  const types = (answer && answer.types) || [];
  // Someone typing a limit keeps their text: the periodic refresh skips the table meanwhile.
  if (!force && $("types").contains(document.activeElement) && document.activeElement.tagName === "INPUT") return;
  if (!types.length) {
    $("types").innerHTML = '<tr><td colspan="4" class="empty">no task types</td></tr>';
    return;
  }
  $("types").innerHTML = types.map(t => {
    const state = t.paused ? "paused" : "running";
    const verb = t.paused ? "resume" : "pause";
    const name = esc(t.type);
    const usage = t.limit == null ? "none" : `${fmt(t.running)} of ${fmt(t.limit)} running, ${fmt(t.blocked)} waiting`;
    // each control sits in the column it changes: pause/resume by the state, the limit by its usage
    return `<tr data-type="${name}"><td class="kind">${name}${t.registered ? "" : " (no handler)"}</td>
      <td class="nowrap"><span class="pill ${state}">${state}</span>
          <button type="button" data-verb="${verb}" data-type="${name}">${verb === "pause" ? "Pause" : "Resume"}</button></td>
      <td class="num">${fmt(t.held)}</td>
      <td><span class="limit-usage">${usage}</span>
          <input type="number" min="1" max="1000" class="limit-input" aria-label="limit of ${name}" placeholder="none"
           value="${t.limit == null ? "" : t.limit}" data-type="${name}">
          <button type="button" data-verb="limit" data-type="${name}">Set limit</button></td></tr>`;
  }).join("");
}

async function sendJSON(method, path, body) {
  const response = await fetch(path, {method, cache: "no-store",
    headers: {"Content-Type": "application/json", "Accept": "application/json"}, body: JSON.stringify(body)});
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(answer.message || `${path}: HTTP ${response.status}`);
  return answer;
}

$("types").addEventListener("click", async event => {
  const button = event.target.closest("button[data-verb]");
  if (!button) return;
  button.disabled = true;
  const path = `/types/${encodeURIComponent(button.dataset.type)}`;
  try {
    if (button.dataset.verb === "limit") {
      const text = button.parentElement.querySelector("input").value.trim();
      await sendJSON("PUT", `${path}/limit`, {limit: text === "" ? null : Number(text)});
    } else {
      await sendJSON("POST", `${path}/${button.dataset.verb}`, {});
    }
    $("error-banner").style.display = "none";
    renderTypes(await allTypes(), true);
  } catch (error) {
    $("error-banner").style.display = "block";
    $("error-banner").textContent = error.message;
    button.disabled = false;
  }
});

// ---- rate limits ----------------------------------------------------------------------------

function renderRates(answer) {
  const limits = (answer && answer.limits) || [];
  if (!limits.length) {
    $("rates").innerHTML = '<tr><td colspan="6" class="empty">no rate limit is set</td></tr>';
    return;
  }
  const when = iso => iso ? esc(new Date(iso).toLocaleTimeString()) : "—";
  $("rates").innerHTML = limits.map(r => {
    const group = esc(r.group);
    return `<tr data-group="${group}"><td class="kind">${group}</td>
      <td class="nowrap">${fmt(r.limit)} per ${fmt(r.interval_seconds)} s</td>
      <td class="num">${fmt(r.started_in_interval)}</td><td class="nowrap">${when(r.next_free_at)}</td>
      <td class="nowrap">${when(r.booked_until)}</td>
      <td><button type="button" data-verb="lift" data-group="${group}">Lift</button></td></tr>`;
  }).join("");
}

async function setRate(group, body) {
  try {
    await sendJSON("PUT", `/rate-limits/${encodeURIComponent(group)}`, body);
    $("error-banner").style.display = "none";
    renderRates(await allRates());
  } catch (error) {
    $("error-banner").style.display = "block";
    $("error-banner").textContent = error.message;
  }
}

$("rate-form").addEventListener("submit", async event => {
  event.preventDefault();
  await setRate($("rate-group").value.trim(),
                {limit: Number($("rate-limit").value), interval_seconds: Number($("rate-per").value || 1)});
});

$("rates").addEventListener("click", async event => {
  const button = event.target.closest("button[data-verb=lift]");
  if (!button) return;
  button.disabled = true;
  await setRate(button.dataset.group, {limit: null});
});

// ---- schedules ------------------------------------------------------------------------------

function renderSchedules(answer) {
  const schedules = (answer && answer.schedules) || [];
  if (!schedules.length) {
    $("schedules").innerHTML = '<tr><td colspan="6" class="empty">no schedules</td></tr>';
    return;
  }
  $("schedules").innerHTML = schedules.map(s => {
    const name = esc(s.name);
    const state = s.paused ? "paused" : "running";
    const verb = s.paused ? "resume" : "pause";
    const next = s.next_run_at ? esc(new Date(s.next_run_at).toLocaleString()) : "—";
    const last = s.last_task_key ? `<a href="#" data-key="${esc(s.last_task_key)}">${esc(s.last_task_key)}</a>` : "—";
    return `<tr><td class="kind">${name}</td>
      <td>${esc(s.expression)} <span class="note">${esc(s.timezone)}, missed: ${esc(s.missed)}</span></td>
      <td>${esc(s.task.type)}</td><td class="nowrap">${next}</td><td>${last}</td>
      <td class="nowrap"><span class="pill ${state}">${state}</span>
          <button type="button" data-verb="${verb}" data-schedule="${name}">${verb === "pause" ? "Pause" : "Resume"}</button>
          <button type="button" data-verb="delete" data-schedule="${name}">Delete</button></td></tr>`;
  }).join("");
}

$("schedules").addEventListener("click", async event => {
  const link = event.target.closest("a[data-key]");
  if (link) {
    event.preventDefault();
    select(link.dataset.key);
    return;
  }
  const button = event.target.closest("button[data-verb]");
  if (!button) return;
  const path = `/schedules/${encodeURIComponent(button.dataset.schedule)}`;
  if (button.dataset.verb === "delete" && !confirm(`Delete schedule ${button.dataset.schedule}? The tasks it put stay.`)) return;
  button.disabled = true;
  try {
    if (button.dataset.verb === "delete") {
      const response = await fetch(path, {method: "DELETE", cache: "no-store", headers: {"Accept": "application/json"}});
      if (!response.ok) throw new Error((await response.json().catch(() => ({}))).message || `HTTP ${response.status}`);
    } else {
      await sendJSON("POST", `${path}/${button.dataset.verb}`, {});
    }
    $("error-banner").style.display = "none";
    renderSchedules(await allSchedules());
  } catch (error) {
    $("error-banner").style.display = "block";
    $("error-banner").textContent = error.message;
    button.disabled = false;
  }
});

// ---- bulk actions -------------------------------------------------------------------------

const BULK_STATUSES = {retry: ["ignored", "failed"], cancel: ["todo", "failed", "processing"]};
const bulk = {counted: null, busy: false};

function postJSON(path, body) {
  return sendJSON("POST", path, body);
}

function bulkFilter() {
  const filter = {action: $("bulk-action").value, status: $("bulk-status").value};
  const type = $("bulk-type").value.trim(), batch = $("bulk-batch").value.trim();
  if (type) filter.type = type;
  if (batch) filter.batch_id = batch;
  return filter;
}

function bulkStatuses() {
  const current = $("bulk-status").value;
  const options = BULK_STATUSES[$("bulk-action").value];
  $("bulk-status").innerHTML = options.map(s => `<option value="${s}">${s}</option>`).join("");
  if (options.includes(current)) $("bulk-status").value = current;
  bulkReset();
}

function bulkReset() {
  bulk.counted = null;
  $("bulk-apply").disabled = true;
  $("bulk-apply").textContent = "Apply";
}

// Every page of the bulk route, to the end; onPage sees the running totals.
async function bulkPages(body, onPage) {
  let cursor = null;
  const totals = {matched: 0, changed: 0, skipped: 0};
  do {
    const answer = await postJSON("/bulk", cursor ? {...body, cursor} : body);
    for (const name of Object.keys(totals)) totals[name] += answer[name];
    cursor = answer.cursor;
    onPage(totals);
  } while (cursor);
  return totals;
}

async function bulkCount(event) {
  event.preventDefault();
  if (bulk.busy) return;
  bulk.busy = true;
  const filter = bulkFilter();
  try {
    const totals = await bulkPages({...filter, dry_run: true, limit: 1000},
      t => { $("bulk-result").textContent = `counting… ${fmt(t.matched)} so far`; });
    bulk.counted = {filter: JSON.stringify(filter), matched: totals.matched};
    $("bulk-result").textContent = `${fmt(totals.matched)} ${filter.status} tasks match (dry run: nothing changed)`;
    $("bulk-apply").disabled = totals.matched === 0;
    $("bulk-apply").textContent = `${filter.action === "retry" ? "Retry" : "Cancel"} ${fmt(totals.matched)} tasks`;
  } catch (error) {
    $("bulk-result").textContent = error.message;
  } finally {
    bulk.busy = false;
  }
}

async function bulkApply() {
  const filter = bulkFilter();
  if (bulk.busy || !bulk.counted || bulk.counted.filter !== JSON.stringify(filter)) return;
  bulk.busy = true;
  $("bulk-apply").disabled = true;
  const total = bulk.counted.matched;
  const verb = filter.action === "retry" ? "retried" : "cancelled";
  try {
    const totals = await bulkPages({...filter, limit: 200},
      t => { $("bulk-result").textContent = `${verb} ${fmt(t.changed)} of ${fmt(total)}…`; });
    $("bulk-result").textContent = `${fmt(totals.changed)} tasks ${verb}` +
      (totals.skipped ? `, ${fmt(totals.skipped)} skipped (they changed state meanwhile)` : "");
  } catch (error) {
    $("bulk-result").textContent = `${error.message} — count again and apply to go on (changed tasks no longer match)`;
  } finally {
    bulk.busy = false;
    bulkReset();
  }
}

$("bulk-action").addEventListener("change", bulkStatuses);
for (const id of ["bulk-status", "bulk-type", "bulk-batch"]) $(id).addEventListener("input", bulkReset);
$("bulk-form").addEventListener("submit", bulkCount);
$("bulk-apply").addEventListener("click", bulkApply);
bulkStatuses();

// ---- events --------------------------------------------------------------------------------

function renderEvents(answer) {
  const items = (answer && answer.items) || [];
  if (!items.length) {
    const why = answer && answer.events === "log" ? "no events yet" : "events are off: start with --events log";
    $("events").innerHTML = `<tr><td colspan="4" class="empty">${why}</td></tr>`;
    return;
  }
  $("events").innerHTML = items.map(event => {
    const d = event.detail || {};
    const about = d.key ? `<a href="#" data-key="${esc(d.key)}">${esc(d.key)}</a>` : `batch ${esc(d.batch_id)}`;
    const what = d.key
      ? `${esc(d.type)}, ${esc(d.attempts)}/${esc(d.max_attempts)} attempts${d.error ? `: ${esc(d.error.kind)} ${esc(d.error.message)}` : ""}`
      : `${esc(d.state)}: ${esc(d.finished)} finished, ${esc(d.ignored)} ignored of ${esc(d.total)}`;
    return `<tr><td class="nowrap">${esc(event["detail-type"])}</td><td>${about}</td><td>${what}</td>
      <td class="note">${esc(d.event_id)}</td></tr>`;
  }).join("");
}

$("events").addEventListener("click", event => {
  const link = event.target.closest("a[data-key]");
  if (!link) return;
  event.preventDefault();
  select(link.dataset.key);
});

// ---- refresh loop -------------------------------------------------------------------------

async function refresh() {
  const problems = [];
  const noted = error => { problems.push(error.message); return null; };
  // Every panel reads its own request and is drawn as soon as that answers: a slow one (the
  // counts, on a busy machine) holds up no other.
  const info = getJSON("/local/info").catch(() => null);
  const stats = getJSON("/stats").catch(noted);
  await Promise.allSettled([
    info.then(answer => { renderBacklog(answer); renderRuntime(answer); drawChart(answer ? answer.series : []); }),
    Promise.all([stats, info]).then(([counts, answer]) => renderCounts(counts, answer)),
    allTypes().then(answer => renderTypes(answer)).catch(noted),
    allSchedules().then(renderSchedules).catch(noted),
    allRates().then(renderRates).catch(noted),
    getJSON("/local/events").then(renderEvents).catch(noted),
    // the batches panel shows the failures' batches too: it follows that panel's answer
    loadFailures().then(renderFailures).catch(noted).then(() => info).then(renderBatches).catch(noted),
    renderDetail().catch(noted),
  ]);
  const banner = $("error-banner");
  banner.style.display = problems.length ? "block" : "none";
  banner.textContent = problems.join(" · ");
  const reached = await stats;
  if (reached) state.lastOk = Date.now();
  const live = $("live");
  live.textContent = state.lastOk ? `updated ${new Date(state.lastOk).toLocaleTimeString()}` : "API not reachable";
  live.classList.toggle("stale", !reached);
}

async function loop() {
  try { await refresh(); } catch (error) { console.error(error); }
  setTimeout(loop, REFRESH_MS);
}

$("failures").addEventListener("click", event => {
  const row = event.target.closest("tr[data-key]");
  if (row) select(row.dataset.key);
});
$("lookup").addEventListener("submit", event => {
  event.preventDefault();
  const key = $("lookup-key").value.trim();
  if (key) select(key);
});
const initial = new URLSearchParams(location.search).get("task");
if (initial) select(initial);
loop();
