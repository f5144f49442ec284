"""The dashboard's HTTP side: the REST API under /api/v1/, /metrics for Prometheus and the
web UI's pages and assets (shipped in the package, nothing fetched at run time).

Every answer is read from the cluster when asked, so any number of dashboards can run and
one started later shows the whole story (gearbus/dashboard/history.py). FastAPI gives the
OpenAPI description (/openapi.json, /docs)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST

from gearbus.dashboard.cluster import ClusterView, Conflict, Invalid, NotFound, Unreachable
from gearbus.dashboard.history import History
from gearbus.dashboard.prometheus import exposition
from gearbus.runtime import state_query
from shared.messages import (
    AppDag,
    AppError,
    ApplicationRestarted,
    AppRescaled,
    AppState,
    AppSummary,
    CheckpointStats,
    ProcessorMetrics,
    TaskCounters,
    WorkerSummary,
)

STATIC = os.path.join(os.path.dirname(__file__), "static")


def _json(value) -> JSONResponse:
    if isinstance(value, list):
        return JSONResponse([v.to_wire() for v in value])
    return JSONResponse(value.to_wire() if hasattr(value, "to_wire") else value)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create_app(view: ClusterView, history: History | None = None) -> FastAPI:
    """``history``: what the charts and the timeline show (a fresh, empty one if None)."""
    history = history or History()
    app = FastAPI(title="gearbus dashboard", version="1",
                  description="A gearbus cluster's masters, workers and applications, read over NATS.")

    @app.exception_handler(Unreachable)
    async def unreachable(_: Request, exc: Unreachable):
        return _error(503, f"cluster unreachable: {exc}")

    @app.exception_handler(NotFound)
    async def not_found(_: Request, exc: NotFound):
        return _error(404, str(exc))

    @app.exception_handler(Conflict)
    async def conflict(_: Request, exc: Conflict):
        return _error(409, str(exc))

    @app.exception_handler(Invalid)
    async def invalid(_: Request, exc: Invalid):
        return _error(400, str(exc))

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors())
        return _error(400, f"bad request: {problems}")

    # --- cluster ---------------------------------------------------------------

    @app.get("/api/v1/cluster", summary="Masters, the leader, workers, and apps by state")
    async def cluster():
        info, apps = await view.info(), await view.apps()
        by_state = {state: 0 for state in sorted(AppState.ALL)}
        for summary in apps:
            by_state[summary.state] += 1
        return JSONResponse({**info.to_wire(), "apps_by_state": by_state,
                             "slots": sum(w.slots for w in info.workers if w.alive),
                             "slots_used": sum(w.slots_used for w in info.workers if w.alive)})

    @app.get("/api/v1/masters", summary="The masters and which one leads")
    async def masters():
        info = await view.info()
        return JSONResponse([{"master_id": m, "leader": m == info.leader} for m in info.masters])

    @app.get("/api/v1/workers", response_model=list[WorkerSummary])
    async def workers():
        return _json((await view.info()).workers)

    @app.get("/api/v1/workers/{worker_id}", response_model=WorkerSummary)
    async def worker(worker_id: str):
        for w in (await view.info()).workers:
            if w.worker_id == worker_id:
                return _json(w)
        raise NotFound(f"no worker {worker_id!r}")

    # --- apps ------------------------------------------------------------------

    @app.get("/api/v1/apps", response_model=list[AppSummary], summary="Every application, newest last")
    async def apps():
        return _json(await view.apps())

    @app.get("/api/v1/apps/{app_id}", response_model=AppSummary,
             summary="One application: state, error, DAG, processors, tasks, checkpoints")
    async def one_app(app_id: int):
        return _json(await view.app(app_id))

    def app_part(path: str, model, pick: Callable[[AppSummary], object], summary: str):
        async def part(app_id: int):
            return _json(pick(await view.app(app_id)))
        app.get(f"/api/v1/apps/{{app_id}}/{path}", response_model=model, summary=summary)(part)

    app_part("dag", AppDag | None, lambda a: a.dag, "The processors and edges (after chaining)")
    app_part("processors", list[ProcessorMetrics], lambda a: a.processors, "Per-processor metrics")
    app_part("tasks", list[TaskCounters], lambda a: a.tasks, "Per-task counters")
    app_part("checkpoints", CheckpointStats | None, lambda a: a.checkpoints, "Checkpoint statistics")
    app_part("error", AppError | None, lambda a: a.error, "Why the app failed (null otherwise)")

    @app.get("/api/v1/apps/{app_id}/executors", summary="Executors, restarts and blacklisted workers")
    async def executors(app_id: int):
        summary = await view.app(app_id)
        return JSONResponse({"executors": summary.executors, "appmaster_worker": summary.appmaster_worker,
                             "restarts": summary.restarts, "blacklisted_workers": summary.blacklisted_workers})

    @app.get("/api/v1/apps/{app_id}/processors/{processor_id}", response_model=ProcessorMetrics)
    async def processor(app_id: int, processor_id: int):
        for p in (await view.app(app_id)).processors:
            if p.processor == processor_id:
                return _json(p)
        raise NotFound(f"app {app_id} has no processor {processor_id}")

    @app.get("/api/v1/apps/{app_id}/tasks/{processor_id}/{index}", response_model=TaskCounters)
    async def task(app_id: int, processor_id: int, index: int):
        for t in (await view.app(app_id)).tasks:
            if (t.task.processor, t.task.index) == (processor_id, index):
                return _json(t)
        raise NotFound(f"app {app_id} has no task {processor_id}.{index}")

    @app.get("/api/v1/apps/{app_id}/metrics", summary="The app's metrics: processors, tasks, clock, checkpoints")
    async def app_metrics(app_id: int):
        a = await view.app(app_id)
        return JSONResponse({"clock": a.clock, "restarts": a.restarts, "stalled_tasks": a.stalled_tasks,
                             "processors": [p.to_wire() for p in a.processors],
                             "tasks": [t.to_wire() for t in a.tasks],
                             "checkpoints": a.checkpoints.to_wire() if a.checkpoints else None})

    @app.get("/api/v1/apps/{app_id}/series",
             summary="Each processor's rate, back-pressure, watermark lag and state size over the last 15 minutes, "
                     "as the app's AppMaster sampled them (once it has gone, as this dashboard did)")
    async def series(app_id: int):
        await view.app(app_id)  # 404 for an app the cluster does not know
        return JSONResponse(history.series(app_id, await view.metrics_history(app_id)))

    @app.get("/api/v1/apps/{app_id}/timeline",
             summary="The app's state changes, rescales, replacements, restarts and checkpoints over the last "
                     "15 minutes, oldest first, at the times they happened")
    async def timeline(app_id: int):
        return JSONResponse(history.timeline(await view.app(app_id), int(time.time() * 1000)))

    @app.get("/api/v1/apps/{app_id}/state/{step}",
             summary="What a keyed step holds for a key (JSON, e.g. ?key=%22word%22), read from its task live")
    async def state(app_id: int, step: str, key: str):
        return JSONResponse(state_query.answer(await view.state(app_id, step, key)))

    @app.post("/api/v1/apps/{app_id}/kill", summary="End the app (TERMINATED)")
    async def kill(app_id: int):
        await view.kill(app_id)
        return JSONResponse({"app_id": app_id, "state": AppState.TERMINATED})

    @app.post("/api/v1/apps/{app_id}/rescale", response_model=AppRescaled,
              summary="Run processors (by step or processor name) at another parallelism while the app runs: "
                      'body {"count": 4}; answered once its tasks run at it')
    async def rescale(app_id: int, parallelism: dict[str, int]):
        return _json(await view.rescale(app_id, parallelism))

    @app.post("/api/v1/apps/{app_id}/restart", response_model=ApplicationRestarted,
              summary="Submit the app again (a running one stops with a savepoint and the new one starts from it)")
    async def restart(app_id: int):
        return _json(await view.restart(app_id))

    # --- Prometheus and the UI ---------------------------------------------------

    @app.get("/metrics", summary="The whole cluster in Prometheus text format", response_class=Response)
    async def metrics():
        info, summaries = await view.info(), await view.apps()
        return Response(exposition(info, summaries), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def index():
        return FileResponse(os.path.join(STATIC, "index.html"))

    @app.get("/apps/{app_id}", include_in_schema=False)
    async def app_page(app_id: int):
        return FileResponse(os.path.join(STATIC, "app.html"))

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app

