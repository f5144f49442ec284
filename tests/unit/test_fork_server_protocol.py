"""The fork server's launch requests (services/worker/forkserver.py), without a process."""

from __future__ import annotations

import signal

import pytest

from services.worker.forkserver import Launch, decode_launch, process_name


def test_a_launch_request_decodes_to_the_launch_encoded():
    launch = Launch(7, "services.executor", ["--nats", "nats://h:4222"], {"GEARBUS_LAUNCH": "x=="}, "/srv",
                    "/logs/w-app1-executor0.log", int(signal.SIGUSR1), "gb-executor")
    line = launch.encode()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_launch(line.rstrip(b"\n")) == launch


@pytest.mark.parametrize("line, says", [
    (b"not json", "malformed launch request b'not json'"),
    (b'{"exited": 3}', "'launch'"),
    (b'{"launch": {"id": 1, "module": "services.executor"}}', "missing"),
])
def test_a_malformed_launch_request_is_refused_saying_what_is_wrong(line, says):
    with pytest.raises(ValueError) as refused:
        decode_launch(line)
    assert says in str(refused.value)


def test_a_forked_role_is_named_in_ps_by_its_module():
    assert process_name("services.executor") == "gb-executor"
    assert process_name("services.appmaster") == "gb-appmaster"
    assert len(process_name("tests.support.launched_role")) == 15  # what the kernel keeps
