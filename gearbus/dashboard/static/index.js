// gearbus dashboard, the cluster page: masters and the leader, workers and their slots, the apps.
"use strict";

function showFacts(cluster) {
  const states = Object.entries(cluster.apps_by_state).filter(([, n]) => n > 0)
    .map(([state, n]) => `${n} ${state}`).join(", ") || "none";
  const facts = [
    ["leader", cluster.leader || "none"],
    ["masters", cluster.masters.length],
    ["workers alive", cluster.workers.filter((w) => w.alive).length],
    ["slots used", `${cluster.slots_used} of ${cluster.slots}`],
    ["apps", states],
  ];
  fillFacts(document.getElementById("cluster-facts"), facts);
}

async function refresh() {
  const [cluster, apps] = await Promise.all([api("/api/v1/cluster"), api("/api/v1/apps")]);
  showFacts(cluster);
  fillTable(document.querySelector("#masters tbody"), cluster.masters,
    (m) => [m, m === cluster.leader ? "leader" : "standby"], "no master");
  const now = Date.now();
  fillTable(document.querySelector("#workers tbody"), cluster.workers, (w) => [
    w.worker_id, w.host, w.pid, num(w.slots_used), num(w.slots), w.alive ? "yes" : "no",
    w.last_heartbeat_ms ? fmtMs(Math.max(0, now - w.last_heartbeat_ms)) + " ago" : "–",
  ], "no worker");
  fillTable(document.querySelector("#apps tbody"), apps.slice().reverse(), (a) => [
    num(a.app_id), el("a", { href: `/apps/${a.app_id}` }, a.name), stateBadge(a.state), a.user || "–",
    fmtTime(a.submitted_ms), fmtTime(a.finished_ms), num(a.executors), num(a.restarts), a.guarantee || "–",
  ], "no application submitted yet");
}

every(refresh);
