"""Who may publish and subscribe to what, per role: the least each role's code needs, written
into its NATS user JWT (by `gearbus security init` for the four roles, by the master for each
application's processes) and enforced by nats-server.

Every identity receives replies only under its own inbox prefix (``_INBOX.<name>``, see
shared/security.py) and may answer the requests it receives (the JWT's response permission).
JetStream is reached through its API subjects (``$JS.API.<op>.<stream>``), so what a role may
do there is named per stream; KV writes are ``$KV.<bucket>.<key>``, objects ``$O.<bucket>.>``."""

from __future__ import annotations

from dataclasses import dataclass

from shared import subjects

ROLES = ("master", "worker", "client", "dashboard")

_ARTIFACTS = f"OBJ_{subjects.ARTIFACT_BUCKET}"
_CHECKPOINT_KV = f"KV_{subjects.CHECKPOINT_BUCKET}"
_CLIENT_REQUESTS = [subjects.APP_SUBMIT, subjects.APP_KILL, subjects.APP_STATUS, subjects.APP_LIST,
                    subjects.APP_SAVEPOINT, subjects.APP_RESTART, subjects.APP_STATE, subjects.APP_DEBUG,
                    subjects.APP_METRICS_HISTORY, subjects.APP_RESCALE, subjects.APP_REPLACE, subjects.APP_SHELL_OUTPUT,
                    subjects.MASTER_INFO, subjects.LOGS_QUERY]


@dataclass(frozen=True)
class Permissions:
    publish: list[str]
    subscribe: list[str]

    def with_streams(self, streams: list[str]) -> Permissions:
        """These, and everything of those JetStream streams (the API names the stream in
        its subject, at one of these depths)."""
        if not streams:
            return self
        api = [pattern for stream in streams for pattern in (
            f"$JS.API.*.*.{stream}", f"$JS.API.*.*.{stream}.>", f"$JS.API.*.*.*.{stream}", f"$JS.API.*.*.*.{stream}.>",
            f"$JS.ACK.{stream}.>", f"$JS.FC.{stream}.>")]
        publish = [*self.publish, *api, "$JS.API.INFO", "$JS.API.STREAM.NAMES"]
        return Permissions(list(dict.fromkeys(publish)), self.subscribe)


def inbox(identity: str) -> str:
    return f"_INBOX.{identity}.>"


def _read_stream(stream: str) -> list[str]:
    """JetStream API calls that read a stream: its info, one message, an ordered consumer
    and a pull consumer's fetches (nats-py looks the stream up by name first)."""
    return ["$JS.API.STREAM.NAMES", f"$JS.API.STREAM.INFO.{stream}", f"$JS.API.STREAM.MSG.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}",
            f"$JS.API.DIRECT.GET.{stream}.>", f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.API.CONSUMER.CREATE.{stream}.>",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>", f"$JS.API.CONSUMER.DELETE.{stream}.>", f"$JS.FC.{stream}.>"]


def role(name: str) -> Permissions:
    """The permissions of one of ROLES."""
    if name == "master":
        return Permissions(
            publish=["app.*.state", subjects.worker_launch("*"), subjects.worker_reregister("*"),
                     subjects.worker_shutdown("*", "*"), subjects.appmaster_reregister("*"),
                     subjects.appmaster_savepoint("*"), subjects.appmaster_state_query("*"), subjects.appmaster_debug("*"),
                     subjects.appmaster_metrics_history("*"), subjects.appmaster_rescale("*"),
                     subjects.appmaster_replace("*"), subjects.appmaster_shell_output("*"), subjects.appmaster_worker_lost("*"),
                     subjects.MASTER_ELECTED, "$JS.API.>", f"$KV.{subjects.STATE_BUCKET}.>",
                     f"$KV.{subjects.MASTERS_BUCKET}.>", "$JS.ACK.>", "$JS.FC.>"],
            subscribe=[*_CLIENT_REQUESTS[:-1], subjects.APP_SUBMIT_SHELL, "master.>", inbox(name)])
    if name == "worker":
        return Permissions(
            publish=[subjects.WORKER_REGISTER, subjects.WORKER_HEARTBEAT, subjects.EXECUTOR_STOPPED,
                     subjects.appmaster_executor_stopped("*")],
            subscribe=[subjects.worker_launch("*"), subjects.worker_shutdown("*", "*"),
                       subjects.worker_reregister("*"), subjects.MASTER_ELECTED, subjects.LOGS_QUERY, inbox(name)])
    if name == "client":
        return Permissions(
            publish=[*_CLIENT_REQUESTS, "$JS.API.INFO", f"$O.{subjects.ARTIFACT_BUCKET}.>", *_read_stream(_ARTIFACTS)],
            subscribe=[subjects.app_state_events("*"), inbox(name)])
    if name == "dashboard":
        return Permissions(
            publish=[subjects.APP_KILL, subjects.APP_STATUS, subjects.APP_LIST, subjects.APP_RESTART,
                     subjects.APP_STATE, subjects.APP_DEBUG, subjects.APP_METRICS_HISTORY, subjects.APP_RESCALE,
                     subjects.MASTER_INFO,
                     subjects.LOGS_QUERY],
            subscribe=[inbox(name)])
    raise ValueError(f"no role {name!r}: one of {', '.join(ROLES)}")


def app_identity(app_id: int) -> str:
    return f"app{app_id}"


def app(app_id: int, savepoint_of: int | None = None, streams: list[str] = ()) -> Permissions:
    """The AppMaster and executors of one application: its own data plane and control
    subjects, its checkpoint records and snapshot store, and reading its artifact (and the
    snapshot store of ``savepoint_of``, the app whose savepoint it starts from); a stage of
    a multi-stage app, also the intermediate ``streams`` of its app (written, read and
    purged). Nothing else of another app's."""
    own = [f"data.{app_id}.>", f"credit.{app_id}.>", f"appmaster.{app_id}.>", f"executor.{app_id}.>"]
    snapshots = subjects.snapshot_bucket(app_id)
    readable = [f"OBJ_{snapshots}", _CHECKPOINT_KV, _ARTIFACTS]
    if savepoint_of is not None and savepoint_of != app_id:
        readable.append(f"OBJ_{subjects.snapshot_bucket(savepoint_of)}")
    return Permissions(
        publish=[*own, *(f"{stream}.*" for stream in streams), f"master.app.{app_id}.>",
                 subjects.worker_shutdown("*", app_id), "$JS.API.INFO",
                 f"$KV.{subjects.CHECKPOINT_BUCKET}.{subjects.checkpoint_app_prefix(app_id)}.>",
                 f"$KV.{subjects.CHECKPOINT_BUCKET}.savepoint.>", f"$O.{snapshots}.>",
                 f"$JS.API.STREAM.PURGE.OBJ_{snapshots}", *(api for stream in readable for api in _read_stream(stream))],
        subscribe=[*own, subjects.MASTER_ELECTED, inbox(app_identity(app_id))]).with_streams(streams)


def data_user(name: str, publish: list[str], subscribe: list[str], streams: list[str],
              allow_shell: bool = False) -> Permissions:
    """A user of your own data (`gearbus security user`): its subjects, and everything of its
    JetStream streams (the API names the stream in its subject, at one of these depths). With
    ``allow_shell`` it is also a client (what ``client.creds`` may do) that may submit shell
    apps, which run a command on every worker they name: the operator's explicit grant."""
    publish = Permissions(list(publish), []).with_streams(streams).publish
    if allow_shell:
        client = role("client")
        publish += [*client.publish, subjects.APP_SUBMIT_SHELL]
        subscribe = [*subscribe, *(s for s in client.subscribe if s != inbox("client"))]
    return Permissions(publish=list(dict.fromkeys(publish)), subscribe=[*subscribe, inbox(name)])
