"""A real dashboard process for tests: started on a free port, stopped with SIGTERM."""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.error
import urllib.request

from tests.support.paths import REPO


class Dashboard:
    def __init__(self, nats_url: str, sample_s: float | None = None):
        """``sample_s``: how often it samples the apps for its charts (None: its default)."""
        self.nats_url = nats_url
        self.sample_s = sample_s
        self.url = ""
        self.process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Dashboard:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.dashboard", "--nats", self.nats_url, "--port", "0",
            *(["--sample-seconds", str(self.sample_s)] if self.sample_s else []), cwd=REPO,
            stderr=asyncio.subprocess.PIPE)
        async with asyncio.timeout(20):
            while True:
                line = (await self.process.stderr.readline()).decode()
                if not line:
                    raise AssertionError(f"the dashboard exited with code {await self.process.wait()}")
                if line.startswith("dashboard on "):
                    self.url = line.split()[-1]
                    return self

    async def __aexit__(self, *exc) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            await asyncio.wait_for(self.process.wait(), 10)

    async def request(self, method: str, path: str) -> tuple[int, bytes, str]:
        """(status, body, content type) of one HTTP request, made off the event loop."""
        def call():
            request = urllib.request.Request(self.url + path, method=method)
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status, response.read(), response.headers.get("Content-Type", "")
            except urllib.error.HTTPError as error:
                return error.code, error.read(), error.headers.get("Content-Type", "")
        return await asyncio.to_thread(call)

    async def json(self, method: str, path: str) -> tuple[int, object]:
        status, body, _ = await self.request(method, path)
        return status, json.loads(body)
