// gearbus dashboard: what both pages share — reading the REST API, the "unreachable" banner,
// number formatting and building DOM from data (always as text, never as HTML).
"use strict";

const REFRESH_MS = 1000;

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function banner(message) {
  const el = document.getElementById("banner");
  el.textContent = message || "";
  el.classList.toggle("shown", Boolean(message));
}

// GET or POST a path of the REST API; a 503 (no master answered) or a dashboard that cannot be
// reached raises the banner, any answer clears it.
async function api(path, options) {
  let response;
  try {
    response = await fetch(path, { cache: "no-store", ...options });
  } catch (err) {
    banner("dashboard unreachable: " + err.message);
    throw new ApiError(0, "dashboard unreachable");
  }
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (response.status === 503) {
    banner(body.error || "cluster unreachable");
    throw new ApiError(503, body.error || "cluster unreachable");
  }
  banner("");
  if (!response.ok) throw new ApiError(response.status, body.error || response.statusText);
  return body;
}

// Run ``refresh`` now and then every REFRESH_MS, never two at once; errors are shown by api().
function every(refresh) {
  const tick = async () => {
    try { await refresh(); } catch (err) { if (!(err instanceof ApiError)) console.error(err); }
    setTimeout(tick, REFRESH_MS);
  };
  tick();
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function stateBadge(state) {
  return el("span", { class: "state " + state }, state);
}

function fmtCount(n) {
  if (n === null || n === undefined) return "–";
  const abs = Math.abs(n);
  if (abs >= 1e9) return (n / 1e9).toFixed(2) + "G";
  if (abs >= 1e6) return (n / 1e6).toFixed(2) + "M";
  if (abs >= 1e4) return (n / 1e3).toFixed(1) + "k";
  return String(Math.round(n));
}

function fmtRate(perSecond) {
  return fmtCount(perSecond) + "/s";
}

function fmtBytes(n) {
  if (n >= 1 << 30) return (n / (1 << 30)).toFixed(2) + " GiB";
  if (n >= 1 << 20) return (n / (1 << 20)).toFixed(1) + " MiB";
  if (n >= 1 << 10) return (n / (1 << 10)).toFixed(1) + " KiB";
  return n + " B";
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms >= 3600000) return (ms / 3600000).toFixed(1) + " h";
  if (ms >= 60000) return (ms / 60000).toFixed(1) + " min";
  if (ms >= 1000) return (ms / 1000).toFixed(1) + " s";
  return ms.toFixed(ms < 10 ? 1 : 0) + " ms";
}

function fmtPercent(share) {
  return Math.round(share * 100) + "%";
}

function fmtTime(epochMs) {
  if (!epochMs) return "–";
  return new Date(epochMs).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

// Watermarks and the app clock are int64 with sentinels (beyond a JS number's exact range):
// the lowest means "no watermark yet", the highest "input ended".
const WATERMARK_BOUND = 2 ** 62;

function fmtWatermark(ms) {
  if (ms === null || ms === undefined || ms <= -WATERMARK_BOUND) return "–";
  if (ms >= WATERMARK_BOUND) return "ended";
  return fmtTime(ms);
}

// Replace a table body's rows with one row per item, made by ``row(item)`` (an array of cells).
function fillTable(tbody, items, row, emptyText) {
  tbody.replaceChildren();
  if (!items.length) {
    const columns = tbody.closest("table").querySelectorAll("thead th").length;
    tbody.append(el("tr", {}, el("td", { colspan: columns, class: "muted" }, emptyText)));
    return;
  }
  for (const item of items) {
    const tr = el("tr");
    for (const cell of row(item)) {
      tr.append(cell instanceof Node && cell.tagName === "TD" ? cell : el("td", {}, cell));
    }
    tbody.append(tr);
  }
}

// Fill a <dl> with one name/value pair per [name, value] of ``facts``.
function fillFacts(dl, facts) {
  dl.replaceChildren(...facts.map(([name, value]) => el("div", {}, el("dt", {}, name), el("dd", {}, value))));
}

function num(value) {
  return el("td", { class: "num" }, value);
}
