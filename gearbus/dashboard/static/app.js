// gearbus dashboard, one application: its DAG laid out by dagre and drawn as SVG (names and
// figures are text in the page), charts and a timeline of the last 15 minutes, per-processor
// and per-task tables, the error, kill and restart.
"use strict";

const APP_ID = Number(location.pathname.split("/").filter(Boolean).pop());
const SVG = "http://www.w3.org/2000/svg";
const LINE_PX = 16;
const NODE_LINES = 5;
const NODE_HEIGHT = NODE_LINES * LINE_PX + 14;
const TERMINAL = new Set(["SUCCEEDED", "FAILED", "TERMINATED"]);
// Flink's back-pressure levels: OK up to 10% of the time waiting for credit, LOW up to 50%, HIGH above.
const PRESSURE_LOW = 0.1;
const PRESSURE_HIGH = 0.5;

let drawnShape = "";  // the DAG's processors and edges as last laid out; figures update in place
let currentState = "";

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function pressureClass(metrics, active) {
  if (!active || !metrics || metrics.finished_tasks >= metrics.parallelism) return "idle";
  if (metrics.backpressure > PRESSURE_HIGH) return "high";
  if (metrics.backpressure > PRESSURE_LOW) return "low";
  return "ok";
}

function nodeLines(info, m) {
  if (!m) return [info.name, `×${info.parallelism}`, "no metrics yet", "", ""];
  const finished = m.finished_tasks ? ` · ${m.finished_tasks} finished` : "";
  return [
    info.name,
    `×${info.parallelism} ${info.task}${finished}`,
    `in ${fmtRate(m.records_in_per_s)} · out ${fmtRate(m.records_out_per_s)}`,
    `p99 ${fmtMs(m.latency_p99_ms)} · lag ${fmtMs(m.watermark_lag_ms)}`,
    `back-pressure ${fmtPercent(m.backpressure)} · busy ${fmtPercent(m.busy)}`,
  ];
}

function nodeWidth(info) {
  const longest = Math.max(info.name.length * 8.5, (info.task.length + 6) * 7, 190);
  return Math.ceil(longest + 24);
}

// Lay the DAG out with dagre and draw it; called only when the processors or edges change.
function layoutDag(dag) {
  const graph = new dagre.graphlib.Graph({ multigraph: true });
  graph.setGraph({ rankdir: "LR", nodesep: 28, ranksep: 90, edgesep: 16, marginx: 8, marginy: 8 });
  graph.setDefaultEdgeLabel(() => ({}));
  for (const p of dag.processors) graph.setNode(String(p.id), { width: nodeWidth(p), height: NODE_HEIGHT });
  dag.edges.forEach((e, i) => graph.setEdge(String(e.source), String(e.target),
    { label: e.partitioner, width: e.partitioner.length * 6.5, height: 14, labelpos: "c" }, String(i)));
  dagre.layout(graph);

  const root = document.getElementById("dag");
  const { width, height } = graph.graph();
  root.setAttribute("viewBox", `0 0 ${Math.ceil(width)} ${Math.ceil(height)}`);
  root.setAttribute("width", Math.ceil(width));
  root.setAttribute("height", Math.ceil(height));
  const defs = svg("defs");
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7,
                                 markerHeight: 7, orient: "auto-start-reverse" });
  marker.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#5b6475" }));
  defs.append(marker);
  root.replaceChildren(defs);

  dag.edges.forEach((e, i) => {
    const laid = graph.edge({ v: String(e.source), w: String(e.target), name: String(i) });
    const group = svg("g", { class: "dag-edge", "data-source": e.source, "data-target": e.target });
    const d = laid.points.map((pt, k) => `${k ? "L" : "M"} ${pt.x.toFixed(1)} ${pt.y.toFixed(1)}`).join(" ");
    group.append(svg("path", { d, "marker-end": "url(#arrow)" }));
    group.append(svg("text", { x: laid.x, y: laid.y + 4, "text-anchor": "middle" }, e.partitioner));
    root.append(group);
  });

  for (const p of dag.processors) {
    const laid = graph.node(String(p.id));
    const x = laid.x - laid.width / 2;
    const y = laid.y - laid.height / 2;
    const group = svg("g", { class: "dag-node idle", "data-processor": p.id, transform: `translate(${x},${y})` });
    group.append(svg("title", {}, `processor ${p.id}: ${p.name}`));
    group.append(svg("rect", { width: laid.width, height: laid.height, rx: 6 }));
    for (let line = 0; line < NODE_LINES; line++) {
      group.append(svg("text", { x: 12, y: 20 + line * LINE_PX, class: line === 0 ? "name" : "figure" }));
    }
    root.append(group);
  }
}

function updateDag(dag, processors, active) {
  const shape = JSON.stringify(dag);
  if (shape !== drawnShape) {
    layoutDag(dag);
    drawnShape = shape;
  }
  const byId = new Map(processors.map((m) => [m.processor, m]));
  for (const p of dag.processors) {
    const group = document.querySelector(`#dag .dag-node[data-processor="${p.id}"]`);
    const metrics = byId.get(p.id);
    group.setAttribute("class", "dag-node " + pressureClass(metrics, active));
    const texts = group.querySelectorAll("text");
    nodeLines(p, metrics).forEach((line, i) => { texts[i].textContent = line; });
  }
}

function showFacts(a) {
  const c = a.checkpoints;
  const facts = [
    ["guarantee", a.guarantee ? a.guarantee + (a.guarantee_detail ? ` (${a.guarantee_detail})` : "") : "–"],
    ["user", a.user || "–"],
    ["submitted", fmtTime(a.submitted_ms)],
    ["finished", fmtTime(a.finished_ms)],
    ["app clock", fmtWatermark(a.clock)],
    ["executors", a.executors],
    ["AppMaster on", a.appmaster_worker || "–"],
    ["restarts", a.restarts],
    ["checkpoints", c ? `${c.completed} done, ${c.failed} failed` + (c.last_id ? `, last #${c.last_id} ${fmtMs(c.last_duration_ms)} ${fmtBytes(c.last_size_bytes)}` : "") : "–"],
  ];
  if (a.stage_apps.length) facts.push(["stages", a.stage_apps.map((id, n) => `${n}: app ${id}`).join(", ")]);
  if (a.stage_of) facts.push(["stage", `${a.stage} of app ${a.stage_of}`]);
  for (const s of a.streams) {
    facts.push([`stream ${s.name}`, `stage ${s.from_stage} → ${s.to_stage}, ${s.partitions} partitions: ` +
      (s.messages < 0 ? "could not be read" : `backlog ${fmtCount(s.messages)} messages, ${fmtBytes(s.bytes)}`)]);
  }
  if (a.stalled_tasks.length) facts.push(["stalled tasks", a.stalled_tasks.join(", ")]);
  if (a.blacklisted_workers.length) facts.push(["blacklisted workers", a.blacklisted_workers.join(", ")]);
  fillFacts(document.getElementById("app-facts"), facts);
}

function showError(error) {
  const section = document.getElementById("error");
  section.classList.toggle("shown", Boolean(error));
  if (!error) return;
  const whose = error.kind === "user" ? "user error" : error.kind === "fault" ? "fault" : "";
  const details = [error.step && `step ${error.step}`, error.location && `at ${error.location}`,
    error.record && `on record ${error.record}`].filter(Boolean).join(", ");
  document.getElementById("error-message").textContent =
    `${error.error_type}: ${error.message}` + (error.where ? ` (in ${error.where})` : "") +
    (whose ? ` [${whose}${details ? `: ${details}` : ""}]` : "");
  document.getElementById("error-traceback").textContent = error.traceback || "";
}

function showTables(a) {
  fillTable(document.querySelector("#processors tbody"), a.processors, (m) => [
    num(m.processor), m.name, num(m.parallelism), num(fmtCount(m.records_in)), num(fmtCount(m.records_out)),
    num(fmtRate(m.records_in_per_s)), num(fmtRate(m.records_out_per_s)), num(fmtMs(m.latency_p50_ms)),
    num(fmtMs(m.latency_p99_ms)), num(fmtMs(m.watermark_lag_ms)), num(fmtPercent(m.backpressure)),
    num(fmtPercent(m.busy)), num(m.inbox_depth), num(m.late_records), num(m.messages_dropped),
    num(fmtCount(m.state_keys)), num(fmtBytes(m.state_bytes)),
  ], "no metrics yet");
  const names = new Map(a.processors.map((m) => [m.processor, m.name]));
  // what became of each version of the app's code (gearbus replace): replaced, running, rolled back
  fillTable(document.querySelector("#versions tbody"), a.versions, (v) => [
    num(v.version), v.state, fmtTime(v.created_ms),
    v.processor < 0 ? "the app as submitted" : `${names.get(v.processor) || v.processor} (step ${v.step})`,
    [v.entry, ...v.args].join(" "), v.error || "",
  ], "not known yet");
  const history = a.checkpoints ? a.checkpoints.history.slice().reverse() : [];
  fillTable(document.querySelector("#checkpoints tbody"), history, (c) => [
    num(c.checkpoint_id), c.status.replace("_", " "), fmtTime(c.trigger_ms),
    num(c.status === "in_progress" ? "–" : fmtMs(c.duration_ms)), num(fmtMs(c.alignment_ms)),
    num(fmtBytes(c.size_bytes)),
    c.processors.map((p) => `${names.get(p.processor) || p.processor}: ${fmtBytes(p.size_bytes)}`).join(", ") || "–",
    c.failure || "",
  ], "no checkpoint yet");
  const tasks = a.tasks.slice().sort((x, y) => x.task.processor - y.task.processor || x.task.index - y.task.index);
  fillTable(document.querySelector("#tasks tbody"), tasks, (t) => [
    `${names.get(t.task.processor) || `task ${t.task.processor}.`}[${t.task.index}]`,
    num(t.executor_id < 0 ? "–" : t.executor_id),
    num(fmtCount(t.records_in)), num(fmtCount(t.records_out)), num(fmtBytes(t.bytes_in)),
    num(fmtBytes(t.bytes_out)), fmtWatermark(t.watermark), num(t.inbox_depth),
    num(fmtMs(t.backpressure_ms)), num(fmtMs(t.busy_ms)), num(t.epoch), t.finished ? "yes" : "no",
  ], "no task running");
}

// Each processor's line on the charts, by its place among the processors (the same on all four).
const SERIES_COLOURS = ["#2456c7", "#2e8b57", "#d08a00", "#8e44ad", "#c62828", "#00838f", "#6d4c41", "#5b6475"];
const CHART_W = 400;
const CHART_H = 120;
const CHART_PAD = 4;
const CHART_FORMAT = { records_in_per_s: fmtRate, backpressure: fmtPercent, watermark_lag_ms: fmtMs,
                       state_bytes: fmtBytes };

// One chart: a line per processor from ``startMs`` to now, up to the largest value seen
// (back-pressure: 100%).
function drawChart(root, figure, series, startMs, endMs) {
  const values = series.samples.flatMap((s) => Object.values(s.processors).map((p) => p[figure] ?? 0));
  const top = figure === "backpressure" ? 1 : Math.max(...values, 0) || 1;
  const x = (t) => CHART_PAD + (CHART_W - 2 * CHART_PAD) * Math.max(t - startMs, 0) / (endMs - startMs);
  const y = (v) => CHART_H - 14 - (CHART_H - 26) * Math.min((v ?? 0) / top, 1);
  root.setAttribute("viewBox", `0 0 ${CHART_W} ${CHART_H}`);
  root.setAttribute("preserveAspectRatio", "none");
  root.replaceChildren(
    svg("line", { class: "axis", x1: CHART_PAD, x2: CHART_W - CHART_PAD, y1: y(0), y2: y(0) }),
    svg("text", { class: "axis-label", x: CHART_PAD, y: 10 }, CHART_FORMAT[figure](top)),
    svg("text", { class: "axis-label", x: CHART_PAD, y: CHART_H - 2 }, `${fmtMs(endMs - startMs)} ago`),
    svg("text", { class: "axis-label", x: CHART_W - CHART_PAD, y: CHART_H - 2, "text-anchor": "end" }, "now"));
  series.processors.forEach((p, i) => {
    const points = series.samples.filter((s) => s.processors[p.processor])
      .map((s) => `${x(s.t_ms).toFixed(1)},${y(s.processors[p.processor][figure]).toFixed(1)}`);
    if (!points.length) return;
    const line = svg("polyline", { class: "series", "data-processor": p.processor, points: points.join(" "),
                                   stroke: SERIES_COLOURS[i % SERIES_COLOURS.length] });
    line.append(svg("title", {}, p.name));
    root.append(line);
  });
}

// Where the charts and the timeline start: the window back from now, or the first sample when
// this dashboard has sampled for less than that.
function chartStart(series, endMs) {
  const first = series.samples.length ? series.samples[0].t_ms : endMs - 1000;
  return Math.max(endMs - series.window_s * 1000, Math.min(first, endMs - 1000));
}

function showCharts(series, startMs, endMs) {
  for (const figure of document.querySelectorAll("#charts figure.chart")) {
    drawChart(figure.querySelector("svg"), figure.dataset.figure, series, startMs, endMs);
  }
  document.getElementById("chart-legend").replaceChildren(...series.processors.map((p, i) =>
    el("span", { style: `--swatch: ${SERIES_COLOURS[i % SERIES_COLOURS.length]}` }, p.name)));
}

// The timeline: a strip with a tick per checkpoint and a mark per restart or state change, and
// those (and failed checkpoints) listed, newest first.
function showTimeline(events, startMs, endMs) {
  const strip = document.getElementById("timeline-strip");
  const width = 1000;
  const x = (t) => 6 + (width - 12) * Math.max(t - startMs, 0) / (endMs - startMs);
  strip.setAttribute("viewBox", `0 0 ${width} 46`);
  strip.setAttribute("preserveAspectRatio", "none");
  strip.replaceChildren(svg("line", { class: "axis", x1: 0, x2: width, y1: 23, y2: 23 }));
  for (const e of events) {
    const node = e.kind.startsWith("checkpoint")
      ? svg("line", { class: `tick ${e.kind}`, x1: x(e.t_ms), x2: x(e.t_ms), y1: 12, y2: 34 })
      : svg("circle", { class: `mark ${e.kind}`, cx: x(e.t_ms), cy: 23, r: 6 });
    node.append(svg("title", {}, `${fmtTime(e.t_ms)} ${e.detail}`));
    strip.append(node);
  }
  const listed = events.filter((e) => e.kind !== "checkpoint_completed").reverse();
  fillTable(document.querySelector("#timeline tbody"), listed, (e) => [
    fmtTime(e.t_ms), e.kind.replace("_", " "), e.detail,
  ], "no restart, state change or failed checkpoint in the last 15 minutes");
}

// The charts' samples (15 minutes of them, the largest answer, changing slowly) are fetched
// every SERIES_MS; the timeline on every refresh.
const SERIES_MS = 5000;
let series = null;
let seriesAt = 0;

async function refreshHistory() {
  const due = !series || Date.now() - seriesAt >= SERIES_MS;
  const [fresh, events] = await Promise.all([due ? api(`/api/v1/apps/${APP_ID}/series`) : null,
                                             api(`/api/v1/apps/${APP_ID}/timeline`)]);
  if (fresh) [series, seriesAt] = [fresh, Date.now()];
  const endMs = Date.now();
  const startMs = Math.min(chartStart(series, endMs), ...events.map((e) => e.t_ms));
  showCharts(series, startMs, endMs);
  showTimeline(events, startMs, endMs);
}

async function refresh() {
  let a;
  try {
    a = await api(`/api/v1/apps/${APP_ID}`);
  } catch (err) {
    if (err.status === 404 || err.status === 400) {
      document.getElementById("app-name").textContent = err.message;
      document.getElementById("kill").disabled = document.getElementById("restart").disabled = true;
    }
    throw err;
  }
  currentState = a.state;
  document.title = `gearbus: ${a.name} (${a.app_id})`;
  document.getElementById("app-title").textContent = `app ${a.app_id}`;
  document.getElementById("app-name").textContent = `${a.name} (app ${a.app_id})`;
  document.getElementById("app-state").replaceWith(Object.assign(stateBadge(a.state), { id: "app-state" }));
  document.getElementById("kill").disabled = TERMINAL.has(a.state);
  showFacts(a);
  showError(a.error);
  if (a.dag) updateDag(a.dag, a.processors, a.state === "ACTIVE");
  if (a.dag) showRescaleChoices(a.dag.processors, a.state === "ACTIVE");
  showTables(a);
  await refreshHistory();
}

// The rescale form's processors, redrawn only when they change (a choice being made stays).
let rescaleChoices = "";

function showRescaleChoices(processors, active) {
  const choices = JSON.stringify(processors.map((p) => [p.id, p.name, p.parallelism]));
  document.getElementById("rescale").disabled = !active;
  if (choices === rescaleChoices) return;
  rescaleChoices = choices;
  const select = document.getElementById("rescale-processor");
  const chosen = select.value;
  select.replaceChildren(...processors.map((p) =>
    el("option", { value: p.name, "data-parallelism": p.parallelism }, `${p.name} (×${p.parallelism})`)));
  if ([...select.options].some((o) => o.value === chosen)) select.value = chosen;
  document.getElementById("rescale-parallelism").value = select.selectedOptions[0]?.dataset.parallelism || 1;
}

async function act(button, verb, confirmText, done, body) {
  if (!window.confirm(confirmText)) return;
  const result = document.getElementById("action-result");
  button.disabled = true;
  result.textContent = `${verb}…`;
  try {
    const options = body === undefined ? { method: "POST" }
      : { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
    done(await api(`/api/v1/apps/${APP_ID}/${verb}`, options));
  } catch (err) {
    result.textContent = `${verb} failed: ${err.message}`;
  } finally {
    button.disabled = (verb === "kill" || verb === "rescale") && TERMINAL.has(currentState);
  }
}

document.getElementById("kill").addEventListener("click", (event) =>
  act(event.currentTarget, "kill", `Kill application ${APP_ID}? Its tasks stop now.`,
      (answer) => { document.getElementById("action-result").textContent = `app ${answer.app_id} ${answer.state}`; }));

document.getElementById("rescale-processor").addEventListener("change", (event) => {
  document.getElementById("rescale-parallelism").value = event.currentTarget.selectedOptions[0].dataset.parallelism;
});

document.getElementById("rescale-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const processor = document.getElementById("rescale-processor").value;
  const parallelism = Number(document.getElementById("rescale-parallelism").value);
  act(document.getElementById("rescale"), "rescale",
      `Run ${processor} of application ${APP_ID} as ${parallelism} tasks? The app goes on from a checkpoint taken now.`,
      (answer) => {
        document.getElementById("action-result").textContent = `rescaled (epoch ${answer.epoch}): ` +
          Object.entries(answer.processors).map(([name, n]) => `${name} ×${n}`).join(", ");
      }, { [processor]: parallelism });
});

document.getElementById("restart").addEventListener("click", (event) =>
  act(event.currentTarget, "restart",
      `Restart application ${APP_ID}? A running app stops with a savepoint and a new one starts from it.`,
      (answer) => {
        const result = document.getElementById("action-result");
        result.replaceChildren("restarted as ", el("a", { href: `/apps/${answer.app_id}` }, `app ${answer.app_id}`),
          answer.from_savepoint ? ` from savepoint ${answer.from_savepoint}` : " afresh");
      }));

every(refresh);
