"""The dashboard's window on the cluster: every read goes over NATS to the leading master
(so it follows a fail-over), and an unreachable cluster is one clear error."""

from __future__ import annotations

from gearbus.client import Client
from shared.bus import NoResponders, RequestError, RequestTimeout
from shared.messages import (ApplicationRestarted, AppRescaled, AppSummary, ClusterInfo, ErrorCode, MetricsHistory,
                             StateValue)
from shared.security import Security

QUERY_TIMEOUT_S = 3.0  # a page must not hang: a master that does not answer this fast is "unreachable"


class Unreachable(Exception):
    """No master answered (NATS down, or no master running)."""


class NotFound(LookupError):
    pass


class Conflict(Exception):
    pass


class Invalid(ValueError):
    """The request is wrong (an unknown step, a key that is not JSON): the message says how."""


class ClusterView:
    def __init__(self, servers: list[str], security: Security = Security(), connect_timeout: float | None = None):
        self.servers = servers
        self.client = Client(servers, timeout=QUERY_TIMEOUT_S, security=security, connect_timeout=connect_timeout)

    async def open(self) -> None:
        """Connect (ConnectionError naming the URL when NATS cannot be reached); later
        outages are ridden out by the connection's reconnects."""
        await self.client.__aenter__()

    async def close(self) -> None:
        await self.client.__aexit__(None, None, None)

    async def _ask(self, call):
        if not self.client.bus.nc.is_connected:
            raise Unreachable(f"NATS at {', '.join(self.servers)} is not connected")
        try:
            return await call
        except (RequestTimeout, NoResponders) as exc:
            raise Unreachable(f"no master answered: {exc.message}") from None
        except RequestError as exc:
            if exc.code == ErrorCode.NOT_FOUND:
                raise NotFound(exc.message) from None
            if exc.code == ErrorCode.CONFLICT:
                raise Conflict(exc.message) from None
            if exc.code == ErrorCode.BAD_REQUEST:
                raise Invalid(exc.message) from None
            raise

    async def info(self) -> ClusterInfo:
        return await self._ask(self.client.info())

    async def apps(self) -> list[AppSummary]:
        return await self._ask(self.client.list())

    async def app(self, app_id: int) -> AppSummary:
        return await self._ask(self.client.status(app_id))

    async def metrics_history(self, app_id: int) -> MetricsHistory | None:
        """What the app's AppMaster kept of its figures; None once it has none (the app is
        not running)."""
        try:
            return await self._ask(self.client.metrics_history(app_id))
        except Conflict:
            return None

    async def kill(self, app_id: int) -> None:
        await self._ask(self.client.kill(app_id))

    async def rescale(self, app_id: int, parallelism: dict[str, int]) -> AppRescaled:
        return await self._ask(self.client.rescale(app_id, parallelism))

    async def restart(self, app_id: int) -> ApplicationRestarted:
        return await self._ask(self.client.restart(app_id))

    async def state(self, app_id: int, step: str, key: str) -> StateValue:
        return await self._ask(self.client.state(app_id, step, key))
