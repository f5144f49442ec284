"""Every argument the command line can check is refused before anything is sent: exit 2
with what is wrong (the cluster's URL here is closed, so a command that got as far as
connecting would fail otherwise, with exit 1)."""

from __future__ import annotations

import pytest

from gearbus.cli import main

CLOSED = ["--nats", "nats://127.0.0.1:1"]


@pytest.mark.parametrize("argv, message", [
    (["rescale", *CLOSED, "3", "count=0"], "argument STEP=N: 'count=0': a parallelism is from 1 to 128"),
    (["rescale", *CLOSED, "3", "count=129"], "'count=129': a parallelism is from 1 to 128"),
    (["rescale", *CLOSED, "3", "count=x"], "'count=x': write STEP=N, e.g. count=4"),
    (["run", "--workers", "0", "app.py"], "argument --workers: must be an integer >= 1, got '0'"),
    (["run", "--slots", "-2", "app.py"], "argument --slots: must be an integer >= 1, got '-2'"),
    (["run", "--timeout", "-1", "app.py"], "argument --timeout: must be a positive number of seconds, got '-1'"),
    (["run", "--dashboard", "70000", "app.py"], "argument --dashboard: must be an integer from 0 to 65535"),
    (["replace", *CLOSED, "--at", "soon", "3", "count", "app.py"], "argument --at: must be an integer >= 0"),
    (["replace", *CLOSED, "--at", "-5", "3", "count", "app.py"], "argument --at: must be an integer >= 0, got '-5'"),
    (["status", *CLOSED, "0"], "argument app_id: must be an integer >= 1, got '0'"),
    (["kill", *CLOSED, "x"], "argument app_id: must be an integer >= 1, got 'x'"),
    (["wait", *CLOSED, "3", "--timeout", "nan"], "argument --timeout: must be a positive number of seconds, got 'nan'"),
    (["list", *CLOSED, "--request-timeout", "0"], "argument --request-timeout: must be a positive number of seconds"),
    (["shell", *CLOSED, "--timeout", "0", "--", "true"], "argument --timeout: must be a positive number of seconds"),
    (["security", "init", "dir", "--days", "0"], "argument --days: must be an integer >= 1, got '0'"),
    (["savepoint", *CLOSED, "3", "--name", "my savepoint"], "argument --name: 'my savepoint': a savepoint name is"),
    (["submit", *CLOSED, "--from-savepoint", "../x", "app.py"], "argument --from-savepoint: '../x': a savepoint name"),
])
def test_an_argument_that_cannot_work_is_refused_by_the_parser(capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_state_key_that_is_not_json_is_refused_before_the_query(capsys):
    assert main(["state", *CLOSED, "3", "count", "word"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gearbus state: the key must be JSON") and "'\"word\"'" in err
