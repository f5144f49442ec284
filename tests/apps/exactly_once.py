"""The chaos tests' pipeline: JSON events from a JetStream stream into three stateful
branches, written to JetStream and to JSON Lines files.

    --stream EV --until N --windows-subject out.windows --running PATH --totals PATH [--ranks task|keyed]

Events are ``{"id": n, "user": "u<k>", "ts": ms}``; a user's events all travel on one
subject, so each user's events reach its tasks in stream order.
- keyed tumbling-window counts (1 s of event time) per user -> JetStream ``windows-subject``;
- a stateful low-level task numbering each user's events (its state: a count per user),
  or with ``--ranks keyed`` a ``stateful_map`` doing the same (its state in the app's
  state backend) -> JSON Lines ``running``;
- a global count per user, combined map-side -> JSON Lines ``totals``.
"""

from __future__ import annotations

import argparse

from gearbus import Pipeline, TumblingWindows
from gearbus.api.task import Task


def user(event: dict) -> str:
    return event["user"]


def event_time(event: dict) -> int:
    return event["ts"]


def window_row(result) -> dict:
    return {"user": result.key, "start": result.window_start, "count": result.value}


def total_row(result) -> dict:
    return {"user": result.key, "count": result.value}


class Numbering(Task):
    """Gives each event its rank among its user's events so far: state that must survive
    a failure exactly (a replayed event gets the same rank, none is skipped)."""

    def on_start(self) -> None:
        self.seen: dict[str, int] = {}

    def on_next(self, record) -> None:
        event = record.value
        rank = self.seen[event["user"]] = self.seen.get(event["user"], 0) + 1
        self.emit({"id": event["id"], "user": event["user"], "rank": rank}, key=event["user"])

    def snapshot(self):
        return dict(self.seen)

    def restore(self, state) -> None:
        self.seen = dict(state)


def ranked(seen, event):
    """``stateful_map``'s numbering: the same ranks, the state held by the state backend."""
    rank = (seen or 0) + 1
    return rank, {"id": event["id"], "user": event["user"], "rank": rank}


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="exactly_once")
    parser.add_argument("--stream", required=True)
    parser.add_argument("--until", type=int, required=True, help="the last stream sequence to read")
    parser.add_argument("--windows-subject", required=True)
    parser.add_argument("--running", required=True)
    parser.add_argument("--totals", required=True)
    parser.add_argument("--ranks", choices=("task", "keyed"), default="task",
                        help="number the events in a custom Task, or with stateful_map")
    opts = parser.parse_args(args)
    pipeline = Pipeline("exactly-once", parallelism=2, config={"executors": 2})
    events = pipeline.read_jetstream(opts.stream, until=opts.until, timestamp_fn=event_time, name="events")
    (events.group_by(user, name="by_user_window")
        .window(TumblingWindows(1000))
        .count(name="per_second")
        .map(window_row, name="window_row")
        .write_jetstream(opts.windows_subject, name="windows_out"))
    by_user = events.group_by(user, name="by_user_rank")
    numbered = by_user.process(Numbering, name="numbering") if opts.ranks == "task" else \
        by_user.stateful_map(ranked, name="numbering")
    numbered.write_jsonl(opts.running, name="running_out")
    (events.group_by(user, name="by_user_total")
        .count(name="total")
        .map(total_row, name="total_row")
        .write_jsonl(opts.totals, name="totals_out"))
    return pipeline
