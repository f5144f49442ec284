"""``python -m services.dashboard`` / ``gearbus dashboard``: serve the REST API, /metrics and
the web UI of the cluster at ``--nats`` (uvicorn, an established ASGI server, runs FastAPI's
app on this process's event loop beside the NATS connection)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time

import structlog

from shared.bus import add_connect_timeout_argument, add_nats_argument, nats_servers
from shared.logging import configure
from shared.nats_jwt import CredentialsError
from shared.security import Security
from shared.security import add_arguments as add_security_arguments

log = structlog.get_logger()
DEFAULT_PORT = 8080


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_nats_argument(parser)
    add_connect_timeout_argument(parser)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"HTTP port (default {DEFAULT_PORT}; 0: any)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--sample-seconds", type=float, default=5.0,
                        help="how often it samples every app, for the checkpoints it keeps and the charts of an "
                             "app that has ended (default 5; a running app's come from its AppMaster)")
    add_security_arguments(parser)


def servers_of(args: argparse.Namespace) -> list[str]:
    return nats_servers(args.nats)


async def serve(servers: list[str], host: str, port: int, own_signals: bool = False,
                security: Security = Security(), sample_s: float = 5.0, connect_timeout: float | None = None) -> int:
    """Serve until cancelled (or, with ``own_signals``, SIGTERM/SIGINT: a graceful stop and
    exit code 0, as every role); print the URL once the port listens. Every ``sample_s``
    the apps' figures are sampled for the charts. ``connect_timeout``: how long to wait for
    NATS at start (default: not at all)."""
    import uvicorn  # here, not at the top: every gearbus command imports this module for its options

    from gearbus.dashboard.api import create_app
    from gearbus.dashboard.cluster import ClusterView
    from gearbus.dashboard.history import History

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):  # uvicorn's would re-raise SIGTERM after stopping: exit -15
            yield

    view = ClusterView(servers, security, connect_timeout)
    try:
        await view.open()
    except ConnectionError as exc:
        print(f"gearbus dashboard: {exc}", file=sys.stderr)
        return 1
    history = History(sample_s)
    server = Server(uvicorn.Config(create_app(view, history), host=host, port=port, log_level="warning",
                                   lifespan="off", access_log=False))
    if own_signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, setattr, server, "should_exit", True)
    serving = asyncio.create_task(server.serve())
    sampling = asyncio.create_task(sample(view, history))
    try:
        while not server.started:
            if serving.done():
                return 1 if serving.exception() or not server.started else 0
            await asyncio.sleep(0.02)
        bound = server.servers[0].sockets[0].getsockname()
        url = f"http://{bound[0]}:{bound[1]}"
        log.info("dashboard_serving", url=url, nats=servers)
        print(f"dashboard on {url}", file=sys.stderr, flush=True)
        await serving
        return 0
    finally:
        server.should_exit = True
        sampling.cancel()
        await asyncio.gather(serving, sampling, return_exceptions=True)
        await view.close()


async def sample(view, history) -> None:
    """Feed what the dashboard keeps of its own (gearbus/dashboard/history.py): every app's
    summary, every ``history.sample_s``; a cluster that does not answer leaves a gap."""
    from gearbus.dashboard.cluster import Unreachable

    while True:
        try:
            history.observe(await view.apps(), int(time.time() * 1000))
        except Unreachable as exc:
            log.info("dashboard_sample_missed", error=str(exc))
        await asyncio.sleep(history.sample_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.dashboard", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        security = Security.from_args(args)
    except CredentialsError as exc:
        parser.error(str(exc))
    configure("dashboard")
    if not args.sample_seconds > 0:
        parser.error("--sample-seconds must be positive")
    return asyncio.run(serve(servers_of(args), args.host, args.port, own_signals=True, security=security,
                             sample_s=args.sample_seconds, connect_timeout=args.connect_timeout))
