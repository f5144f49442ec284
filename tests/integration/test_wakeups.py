"""Processing-time wakeups on an executor: a task speaks on its own clock, without input,
while its input lasts; its end does not wait for the next wakeup."""

from __future__ import annotations

import os

from gearbus.artifact import pack
from shared.messages import AppState
from tests.support.files import read_jsonl
from tests.support.paths import APPS


async def test_a_task_wakes_up_between_its_records_and_ends_with_its_input(client, tmp_path):
    output = tmp_path / "pulses.jsonl"
    app_id = await client.submit(pack(os.path.join(APPS, "pulses.py")),
                                 ["--output", str(output), "--rate", "40", "--count", "80", "--every-ms", "100"])
    final = await client.wait(app_id, timeout=60)
    assert final.state == AppState.SUCCEEDED, final.error
    rows = read_jsonl(output)
    seen = [row["pulse"] for row in rows[:-1]]
    assert rows[-1] == {"end": 80} and all("pulse" in row for row in rows[:-1])
    assert len(seen) >= 3 and seen == sorted(seen) and seen[-1] < 80  # 2 s of input, a pulse every 0.1 s
