"""Live terminal views with rich: the progress line of ``gearbus run`` and ``gearbus top``
(or its figures as JSON lines). They only show what the cluster reports (AppSummary's
processors and clock)."""

from __future__ import annotations

import asyncio
import json
import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.client import Client
from shared.messages import AppState, AppSummary

REFRESH_S = 0.5


class OutputConsole(Console):
    """rich's Console, except that a reader gone from its pipe raises BrokenPipeError, as
    print() does (rich exits 1 itself): the command line ends every such case alike."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError("the reader of the output has gone")


def _count(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def _watermark(ms: int | None) -> str:
    if ms is None or ms <= WATERMARK_MIN:
        return "-"
    if ms >= WATERMARK_MAX:
        return "end"
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}"


def progress_line(app: AppSummary) -> Text:
    """One line: state, records read by sources and written by sinks, rates, clock."""
    dag = app.dag
    sources = {p.id for p in dag.processors} - {e.target for e in dag.edges} if dag else set()
    sinks = {p.id for p in dag.processors} - {e.source for e in dag.edges} if dag else set()
    read = sum(p.records_in for p in app.processors if p.processor in sources)
    read_rate = sum(p.records_in_per_s for p in app.processors if p.processor in sources)
    written = sum(p.records_in for p in app.processors if p.processor in sinks)
    line = Text(f"app {app.app_id} {app.state}", style="bold")
    line.append(f"  read {_count(read)} ({_count(read_rate)}/s)  sunk {_count(written)}"
                f"  watermark {_watermark(app.clock)}")
    if app.restarts:
        line.append(f"  restarts {app.restarts}", style="yellow")
    return line


def processor_table(app: AppSummary) -> Table:
    table = Table(title=f"app {app.app_id} {app.name}: {app.state}", title_justify="left", expand=False)
    for column in ("processor", "tasks", "in/s", "out/s", "in", "out", "p99 ms", "lag s", "back-pressure"):
        table.add_column(column, justify="left" if column == "processor" else "right")
    for p in app.processors:
        pressure = f"{p.backpressure:.0%}"
        table.add_row(p.name, f"{p.parallelism - p.finished_tasks}/{p.parallelism}", _count(p.records_in_per_s),
                      _count(p.records_out_per_s), _count(p.records_in), _count(p.records_out),
                      "-" if p.latency_p99_ms is None else f"{p.latency_p99_ms:g}",
                      "-" if p.watermark_lag_ms is None else f"{p.watermark_lag_ms / 1000:.1f}",
                      Text(pressure, style="red" if p.backpressure >= 0.5 else "yellow" if p.backpressure >= 0.1
                           else "green"))
    return table


async def show_progress(client: Client, app_id: int, console: Console) -> None:
    """Redraw the progress line until cancelled (``gearbus run`` on a terminal)."""
    with Live(console=console, refresh_per_second=4, transient=True) as live:
        while True:
            live.update(progress_line(await client.status(app_id)))
            await asyncio.sleep(REFRESH_S)


async def top_apps(client: Client, include_finished: bool) -> list[AppSummary]:
    """The apps ``gearbus top`` shows: those running, those with processors to show."""
    return [a for a in await client.list(include_finished) if a.processors or a.state not in AppState.TERMINAL]


def _top_view(apps: list[AppSummary]) -> Group | Text:
    return Group(*(processor_table(a) for a in apps)) if apps else Text("no applications running")


async def top(client: Client, console: Console, include_finished: bool) -> None:
    """Every app's processors until interrupted (``gearbus top``): redrawn in place on a
    terminal; into a pipe or a file, one view after another (a live display would show
    nothing there until it stopped)."""
    if not console.is_terminal:
        while True:
            console.print(_top_view(await top_apps(client, include_finished)))
            await asyncio.sleep(REFRESH_S)
    with Live(console=console, refresh_per_second=4, screen=True) as live:
        while True:
            live.update(_top_view(await top_apps(client, include_finished)))
            await asyncio.sleep(REFRESH_S)


def top_snapshot(apps: list[AppSummary], now_ms: int) -> dict:
    """One refresh of ``gearbus top --json``: each app's processors, every figure the table
    shows and more, unrounded."""
    return {"time_ms": now_ms,
            "apps": [{"app_id": a.app_id, "name": a.name, "state": a.state, "clock": a.clock,
                      "processors": [p.to_wire() for p in a.processors]} for a in apps]}


async def top_json(client: Client, include_finished: bool, once: bool) -> None:
    """``gearbus top --json``: a snapshot per refresh, one JSON document a line (``once``:
    just one), until interrupted."""
    while True:
        apps = await top_apps(client, include_finished)
        print(json.dumps(top_snapshot(apps, int(time.time() * 1000))), flush=True)
        if once:
            return
        await asyncio.sleep(REFRESH_S)
