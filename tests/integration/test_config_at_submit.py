"""A config that cannot run is refused before an app id exists, as a user meets it: a real
`gearbus` process against a real cluster, which is left without an app."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.cli import gearbus
from tests.support.paths import APPS

CONFIGURED = os.path.join(APPS, "configured.py")


BAD_CONFIGS = [
    ({"chekpoint_interval_ms": 500},
     "unknown application config key 'chekpoint_interval_ms': did you mean 'checkpoint_interval_ms'?"),
    ({"state_backend": "no-such-backend"},
     "application config state_backend must be one of memory, rocksdb, got 'no-such-backend'"),
]


@pytest.mark.parametrize("command", [["submit"], ["run", "--runner", "cluster"], ["run", "--runner", "test"]])
async def test_a_bad_config_is_refused_before_an_app_exists(shared_cluster, tmp_path, command):
    output = tmp_path / "out.jsonl"
    for config, message in BAD_CONFIGS:
        code, out, err = await gearbus(*command, "--nats", shared_cluster.url, CONFIGURED, json.dumps(config),
                                       str(output))
        assert code == 2, (config, out, err)
        assert message in err and "Traceback" not in err, err
    code, out, err = await gearbus("list", "--nats", shared_cluster.url, "--json")
    assert code == 0 and json.loads(out) == [], (out, err)
    assert not output.exists()
