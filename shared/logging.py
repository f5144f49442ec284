"""structlog set-up shared by every role: JSON lines, or console output on a terminal."""

from __future__ import annotations

import logging
import os
import sys

import structlog


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
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(role=role, node_id=node_id or f"{role}-{os.getpid()}", **bound)
    return structlog.get_logger()
