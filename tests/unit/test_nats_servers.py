"""Where a role's NATS is: the flag, else $GEARBUS_NATS_URL (comma-separated), else the default."""

from __future__ import annotations

import pytest

from shared.bus import DEFAULT_NATS_URL, NATS_URL_ENV, nats_servers

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("given, environ, expected", [
    (["nats://a:1"], {NATS_URL_ENV: "nats://b:2"}, ["nats://a:1"]),
    (["nats://a:1", "nats://c:3"], {}, ["nats://a:1", "nats://c:3"]),
    (None, {NATS_URL_ENV: "nats://b:2"}, ["nats://b:2"]),
    (None, {NATS_URL_ENV: "nats://b:2, nats://d:4,"}, ["nats://b:2", "nats://d:4"]),
    (None, {NATS_URL_ENV: " "}, [DEFAULT_NATS_URL]),
    (None, {}, [DEFAULT_NATS_URL]),
])
def test_the_flag_wins_over_the_environment_which_wins_over_the_default(given, environ, expected):
    assert nats_servers(given, environ) == expected
