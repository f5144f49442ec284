"""What a relative file path in an app means: a path in the directory of whoever submitted
the app, on every runner. The client builds the pipeline in that directory; an AppMaster
or executor rebuilding it on a worker does so inside :func:`submitted_from` the directory
the submission carried, so the file steps hold the same absolute paths everywhere (no
``os.chdir`` in long-lived processes)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_submitter_dir: ContextVar[str] = ContextVar("gearbus_submitter_dir", default="")


def submitter_path(path: str | os.PathLike) -> str:
    """``path`` as an absolute path: a relative one is taken in the submitter's directory
    (this process's working directory while the client builds the pipeline)."""
    return os.path.normpath(os.path.join(_submitter_dir.get() or os.getcwd(), os.fspath(path)))


@contextmanager
def submitted_from(directory: str) -> Iterator[None]:
    """Build an app here as if in ``directory`` ("": this process's working directory)."""
    token = _submitter_dir.set(directory)
    try:
        yield
    finally:
        _submitter_dir.reset(token)
