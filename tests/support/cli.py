"""The gearbus command line run as a user runs it: a real process."""

from __future__ import annotations

import asyncio
import os
import sys

from tests.support.paths import REPO

GEARBUS = [sys.executable, "-m", "gearbus.cli"]


async def gearbus(*args: str, timeout: float = 90, cwd=REPO) -> tuple[int, str, str]:
    """Run ``gearbus ARGS`` from the repository (or ``cwd``); (exit code, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(*GEARBUS, *args, cwd=cwd, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    return process.returncode, out.decode(), err.decode()


async def gearbus_into_a_closed_pipe(*args: str, timeout: float = 90) -> tuple[int, str]:
    """Run ``gearbus ARGS`` with its stdout a pipe whose reader has already gone (as
    ``| head -1`` leaves it once it has its line); (exit code, stderr)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        process = await asyncio.create_subprocess_exec(*GEARBUS, *args, cwd=REPO, stdout=write_end,
                                                       stderr=asyncio.subprocess.PIPE)
    finally:
        os.close(write_end)
    _, err = await asyncio.wait_for(process.communicate(), timeout)
    return process.returncode, err.decode()


async def gearbus_lines(*args: str, lines: int, timeout: float = 60) -> list[str]:
    """The first ``lines`` lines ``gearbus ARGS`` prints, then it is stopped (a command that
    runs until interrupted, as ``top``)."""
    process = await asyncio.create_subprocess_exec(*GEARBUS, *args, cwd=REPO, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.DEVNULL)
    try:
        async with asyncio.timeout(timeout):
            return [(await process.stdout.readline()).decode() for _ in range(lines)]
    finally:
        process.terminate()
        await process.wait()
