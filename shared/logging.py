"""structlog set-up shared by every role: JSON lines, or console output on a terminal."""

from __future__ import annotations

import logging
import os
import sys

import structlog


def _quiet_tls_close(record: logging.LogRecord) -> bool:
    """asyncio warns on every TLS connection nats-py closes ("returning true from
    eof_received() has no effect when using ssl"): noise, not news."""
    return "eof_received()" not in record.getMessage()


def configure(role: str, node_id: str = "", level: str | None = None, **bound) -> structlog.BoundLogger:
    """Configure structlog once for this process and return a logger bound to the role.

    ``role``, ``node_id`` and any further ids given (app_id, executor_id, task_id) are
    bound to every event of the process through contextvars.
    """
    level_name = (level or os.environ.get("GEARBUS_LOG_LEVEL", "info")).upper()
    renderer = (
        structlog.dev.ConsoleRenderer()
        if sys.stderr.isatty()
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level_name, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.getLogger("asyncio").addFilter(_quiet_tls_close)
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(role=role, node_id=node_id or f"{role}-{os.getpid()}", **bound)
    return structlog.get_logger()
