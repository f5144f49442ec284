"""The gearbus command line run as a user runs it: a real process."""

from __future__ import annotations

import asyncio
import sys

from tests.support.paths import REPO

GEARBUS = [sys.executable, "-m", "gearbus.cli"]


async def gearbus(*args: str, timeout: float = 90, cwd=REPO) -> tuple[int, str, str]:
    """Run ``gearbus ARGS`` from the repository (or ``cwd``); (exit code, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(*GEARBUS, *args, cwd=cwd, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    return process.returncode, out.decode(), err.decode()
