"""The cluster in Prometheus text format: one scrape target for masters, workers, apps,
processors and tasks, built per scrape from what the masters report (prometheus-client's
collector API; names and labels by Prometheus conventions)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from shared.messages import BATCH_MS_BOUNDS, AppState, AppSummary, ClusterInfo

_TASK_COUNTERS = (  # TaskCounters field, metric name (without _total), help, scale
    ("records_in", "gearbus_task_records_in", "Records a task received (a source: read)", 1),
    ("records_out", "gearbus_task_records_out", "Records a task sent downstream", 1),
    ("bytes_in", "gearbus_task_bytes_in", "Encoded frame bytes a task received", 1),
    ("bytes_out", "gearbus_task_bytes_out", "Encoded frame bytes a task sent", 1),
    ("frames_in", "gearbus_task_frames_in", "Data frames a task received", 1),
    ("frames_out", "gearbus_task_frames_out", "Data frames a task sent", 1),
    ("late_records", "gearbus_task_late_records", "Records too late for their window", 1),
    ("messages_dropped", "gearbus_task_messages_dropped", "Inbox messages and credit grants dropped", 1),
    ("stale_frames", "gearbus_task_stale_frames", "Frames of another attempt dropped unread", 1),
    ("dead_letters", "gearbus_task_dead_letters", "Source messages that did not decode", 1),
    ("backpressure_ms", "gearbus_task_backpressure_seconds", "Time a task waited for credit", 1e-3),
)
_PROCESSOR_GAUGES = (  # ProcessorMetrics field, metric name, help
    ("records_in_per_s", "gearbus_processor_records_in_per_second", "Records received per second"),
    ("records_out_per_s", "gearbus_processor_records_out_per_second", "Records sent per second"),
    ("backpressure", "gearbus_processor_backpressure_ratio", "Largest share of time a task waited for credit"),
    ("busy", "gearbus_processor_busy_ratio", "Largest share of time a task spent processing"),
    ("inbox_depth", "gearbus_processor_inbox_depth", "Messages waiting in the tasks' inboxes"),
    ("state_keys", "gearbus_state_keys", "Keyed entries its stateful steps hold (a key per window it is in)"),
    ("state_bytes", "gearbus_state_bytes", "Estimated bytes of its stateful steps' state"),
)
_BUCKET_BOUNDS_S = [str(b / 1000) for b in BATCH_MS_BOUNDS] + ["+Inf"]


class _Snapshot:
    """A collector over one moment's reports."""

    def __init__(self, info: ClusterInfo, apps: list[AppSummary]):
        self.info, self.apps = info, apps

    def collect(self):
        yield from self._cluster()
        running = [a for a in self.apps if a.state not in AppState.TERMINAL or a.tasks]
        yield from self._apps(running)
        yield from self._processors(running)
        yield from self._tasks(running)

    def _cluster(self):
        masters = GaugeMetricFamily("gearbus_master_leader", "1 for the leading master, 0 for a standby",
                                    labels=["master"])
        for master in self.info.masters:
            masters.add_metric([master], 1 if master == self.info.leader else 0)
        yield masters
        workers = GaugeMetricFamily("gearbus_worker_up", "1 while a worker heartbeats", labels=["worker"])
        slots = GaugeMetricFamily("gearbus_worker_slots", "Slots a worker offers", labels=["worker"])
        used = GaugeMetricFamily("gearbus_worker_slots_used", "Slots allocated on a worker", labels=["worker"])
        for w in self.info.workers:
            workers.add_metric([w.worker_id], 1 if w.alive else 0)
            slots.add_metric([w.worker_id], w.slots)
            used.add_metric([w.worker_id], w.slots_used)
        yield from (workers, slots, used)
        by_state = GaugeMetricFamily("gearbus_apps", "Applications by state", labels=["state"])
        for state in sorted(AppState.ALL):
            by_state.add_metric([state], sum(1 for a in self.apps if a.state == state))
        yield by_state

    def _apps(self, apps: list[AppSummary]):
        labels = ["app", "app_name"]
        restarts = CounterMetricFamily("gearbus_app_restarts", "Rollbacks to the last checkpoint", labels=labels)
        completed = CounterMetricFamily("gearbus_app_checkpoints_completed", "Checkpoints completed", labels=labels)
        failed = CounterMetricFamily("gearbus_app_checkpoints_failed", "Checkpoints abandoned or failed",
                                     labels=labels)
        duration = GaugeMetricFamily("gearbus_app_last_checkpoint_duration_seconds",
                                     "How long the last completed checkpoint took", labels=labels)
        size = GaugeMetricFamily("gearbus_app_last_checkpoint_size_bytes", "Size of the last completed checkpoint",
                                 labels=labels)
        alignment = GaugeMetricFamily("gearbus_app_last_checkpoint_alignment_seconds",
                                      "The longest barrier alignment of the last completed checkpoint", labels=labels)
        last_id = GaugeMetricFamily("gearbus_app_last_checkpoint_id", "The last completed checkpoint", labels=labels)
        by_processor = GaugeMetricFamily("gearbus_processor_last_checkpoint_size_bytes",
                                         "What a processor's tasks stored for the last completed checkpoint",
                                         labels=[*labels, "processor"])
        for a in apps:
            key = [str(a.app_id), a.name]
            restarts.add_metric(key, a.restarts)
            if a.checkpoints is not None:
                completed.add_metric(key, a.checkpoints.completed)
                failed.add_metric(key, a.checkpoints.failed)
                duration.add_metric(key, a.checkpoints.last_duration_ms / 1000)
                size.add_metric(key, a.checkpoints.last_size_bytes)
                done = [c for c in a.checkpoints.history if c.status == "completed"]
                if done:
                    alignment.add_metric(key, done[-1].alignment_ms / 1000)
                    last_id.add_metric(key, done[-1].checkpoint_id)
                    names = {p.processor: p.name for p in a.processors}
                    for p in done[-1].processors:
                        by_processor.add_metric([*key, names.get(p.processor, str(p.processor))], p.size_bytes)
        yield from (restarts, completed, failed, duration, size, alignment, last_id, by_processor)

    def _processors(self, apps: list[AppSummary]):
        labels = ["app", "app_name", "processor"]
        families = [GaugeMetricFamily(name, text, labels=labels) for _, name, text in _PROCESSOR_GAUGES]
        lag = GaugeMetricFamily("gearbus_processor_watermark_lag_seconds",
                                "Event-time lag: now minus the lowest watermark of its running tasks", labels=labels)
        for a in apps:
            for p in a.processors:
                key = [str(a.app_id), a.name, p.name]
                for (field, _, _), family in zip(_PROCESSOR_GAUGES, families):
                    family.add_metric(key, getattr(p, field))
                if p.watermark_lag_ms is not None:
                    lag.add_metric(key, p.watermark_lag_ms / 1000)
        yield from families
        yield lag

    def _tasks(self, apps: list[AppSummary]):
        labels = ["app", "app_name", "processor", "task"]
        counters = [CounterMetricFamily(name, text, labels=labels) for _, name, text, _ in _TASK_COUNTERS]
        watermark = GaugeMetricFamily("gearbus_task_watermark_milliseconds", "A task's watermark (epoch ms)",
                                      labels=labels)
        depth = GaugeMetricFamily("gearbus_task_inbox_depth", "Messages waiting in a task's inbox", labels=labels)
        batches = HistogramMetricFamily("gearbus_task_batch_seconds", "Time to process one batch", labels=labels)
        for a in apps:
            names = {p.id: p.name for p in a.dag.processors} if a.dag else {}
            for t in a.tasks:
                key = [str(a.app_id), a.name, names.get(t.task.processor, str(t.task.processor)), str(t.task.index)]
                for (field, _, _, scale), family in zip(_TASK_COUNTERS, counters):
                    family.add_metric(key, getattr(t, field) * scale)
                if WATERMARK_MIN < t.watermark < WATERMARK_MAX:  # not the "none yet" / "ended" sentinels
                    watermark.add_metric(key, t.watermark)
                depth.add_metric(key, t.inbox_depth)
                if t.batch_ms_buckets:
                    cumulative, running = [], 0
                    for bound, count in zip(_BUCKET_BOUNDS_S, t.batch_ms_buckets):
                        running += count
                        cumulative.append((bound, running))
                    batches.add_metric(key, cumulative, sum_value=t.busy_ms / 1000)
        yield from counters
        yield from (watermark, depth, batches)


def exposition(info: ClusterInfo, apps: list[AppSummary]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(info, apps))
    return generate_latest(registry)
