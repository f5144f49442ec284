"""Every NATS subject gearbus uses, built in one place (no subject literals elsewhere)."""

from __future__ import annotations

# client -> leader master (request/reply)
APP_SUBMIT = "app.submit"
#: shell apps only: a credential may publish here only when the operator granted it (--allow-shell)
APP_SUBMIT_SHELL = "app.submit.shell"
APP_SHELL_OUTPUT = "app.shell.output"
APP_KILL = "app.kill"
APP_STATUS = "app.status"
APP_LIST = "app.list"
APP_SAVEPOINT = "app.savepoint"
APP_RESTART = "app.restart"
APP_STATE = "app.state"
APP_DEBUG = "app.debug"
APP_METRICS_HISTORY = "app.metrics.history"
APP_RESCALE = "app.rescale"
APP_REPLACE = "app.replace"
MASTER_INFO = "master.info"
LOGS_QUERY = "logs.query"  # every worker answers (scatter-gather)

# workers -> leader master
WORKER_REGISTER = "master.worker.register"
WORKER_HEARTBEAT = "master.worker.heartbeat"
EXECUTOR_STOPPED = "master.executor.stopped"


#: The leader announces itself here when it takes over; workers and AppMasters re-register.
MASTER_ELECTED = "master.elected"

# JetStream buckets
STATE_BUCKET = "gearbus_state"
ARTIFACT_BUCKET = "gearbus_artifacts"
MASTERS_BUCKET = "gearbus_masters"  # the leader lease and the registry of running masters
CHECKPOINT_BUCKET = "gearbus_checkpoints"  # KV of completed checkpoints, epochs and savepoint records


# AppMasters -> leader master: under master.app.<app>, so an app's credential reaches only its
# own (the master checks that the message's app_id is the subject's).
APP_TOKEN_IN_MASTER_SUBJECTS = 2


def appmaster_register(app_id: int | str) -> str:
    return f"master.app.{app_id}.register"


def appmaster_heartbeat(app_id: int | str) -> str:
    return f"master.app.{app_id}.heartbeat"


def appmaster_state(app_id: int | str) -> str:
    return f"master.app.{app_id}.state"


def resource_request(app_id: int | str) -> str:
    return f"master.app.{app_id}.resource.request"


def executor_launch(app_id: int | str) -> str:
    """The AppMaster asks the master to start one of its executors (only masters launch)."""
    return f"master.app.{app_id}.executor.launch"


def appmaster_stages(app_id: int | str) -> str:
    """A multi-stage app's AppMaster asks the master to make its streams and start its stages."""
    return f"master.app.{app_id}.stages"


def app_state_events(app_id: int) -> str:
    """The master publishes ApplicationStateChanged here on every state change."""
    return f"app.{app_id}.state"


def worker_launch(worker_id: str) -> str:
    return f"worker.{worker_id}.launch"


#: worker.<worker>.app.<app>.shutdown: the app's token, checked against the message's app_id.
APP_TOKEN_IN_SHUTDOWN = 3


def worker_shutdown(worker_id: str, app_id: int | str) -> str:
    return f"worker.{worker_id}.app.{app_id}.shutdown"


def worker_reregister(worker_id: str) -> str:
    """The master tells a worker it does not know to register again."""
    return f"worker.{worker_id}.reregister"


def appmaster_reregister(app_id: int) -> str:
    return f"appmaster.{app_id}.reregister"


def appmaster_executor_register(app_id: int) -> str:
    return f"appmaster.{app_id}.executor.register"


def appmaster_executor_heartbeat(app_id: int) -> str:
    return f"appmaster.{app_id}.executor.heartbeat"


def appmaster_executor_stopped(app_id: int) -> str:
    return f"appmaster.{app_id}.executor.stopped"


def appmaster_worker_lost(app_id: int) -> str:
    return f"appmaster.{app_id}.worker.lost"


def appmaster_task_finished(app_id: int) -> str:
    return f"appmaster.{app_id}.task.finished"


def appmaster_task_failed(app_id: int) -> str:
    return f"appmaster.{app_id}.task.failed"


def appmaster_task_ended(app_id: int) -> str:
    return f"appmaster.{app_id}.task.ended"


def appmaster_checkpoint_ack(app_id: int) -> str:
    """TaskCheckpointed and CheckpointDeclined from executors."""
    return f"appmaster.{app_id}.checkpoint.ack"


def checkpoint_trigger(app_id: int) -> str:
    """The AppMaster asks every executor of the app to inject a checkpoint's barriers."""
    return f"executor.{app_id}.checkpoint.trigger"


def checkpoint_complete(app_id: int) -> str:
    """The AppMaster tells every executor of the app that a checkpoint completed."""
    return f"executor.{app_id}.checkpoint.complete"


def snapshot_bucket(app_id: int) -> str:
    """The object store of one app's task snapshots and savepoint states: one per app, so
    an app's credential can write its own and no other's."""
    return f"{CHECKPOINT_BUCKET}_app{app_id}"


def checkpoint_object(app_id: int, checkpoint_id: int, epoch: int, processor: int, index: int) -> str:
    """The name of one task's snapshot in the checkpoint object store (per epoch: a late
    upload of a replaced attempt never overwrites its successor's)."""
    return f"app{app_id}/cp{checkpoint_id}e{epoch}/{processor}.{index}"


def checkpoint_app_prefix(app_id: int) -> str:
    """The first token of every key of one app in the checkpoint KV bucket."""
    return f"app{app_id}"


def checkpoint_key(app_id: int, checkpoint_id: int) -> str:
    """One completed checkpoint's record in the checkpoint KV bucket."""
    return f"{checkpoint_app_prefix(app_id)}.cp{checkpoint_id}"


def checkpoint_latest_key(app_id: int) -> str:
    """The id and record of the app's latest completed checkpoint."""
    return f"{checkpoint_app_prefix(app_id)}.latest"


def appmaster_savepoint(app_id: int) -> str:
    """The master passes a client's TakeSavepoint to the app's AppMaster."""
    return f"appmaster.{app_id}.savepoint"


def appmaster_state_query(app_id: int | str) -> str:
    """The master passes a client's QueryState to the app's AppMaster."""
    return f"appmaster.{app_id}.state.query"


def appmaster_rescale(app_id: int | str) -> str:
    """The master passes a client's RescaleApplication to the app's AppMaster."""
    return f"appmaster.{app_id}.rescale"


def appmaster_replace(app_id: int | str) -> str:
    """The master passes a client's ReplaceProcessor to the app's AppMaster."""
    return f"appmaster.{app_id}.replace"


def appmaster_debug(app_id: int | str) -> str:
    """The master passes a client's QueryStimuli to the app's AppMaster."""
    return f"appmaster.{app_id}.debug"


def appmaster_metrics_history(app_id: int | str) -> str:
    """The master passes a client's QueryMetricsHistory to the app's AppMaster."""
    return f"appmaster.{app_id}.metrics.history"


def executor_state_query(app_id: int, executor_id: int) -> str:
    """The AppMaster asks the executor hosting the task that owns a key for its state."""
    return f"executor.{app_id}.{executor_id}.state"


def savepoint_object(name: str, step: str, index: int) -> str:
    """One task's state of one step in a savepoint (checkpoint object store)."""
    return f"savepoints/{name}/{step}/{index}"


def savepoint_key(name: str) -> str:
    """A savepoint's record in the checkpoint KV bucket."""
    return f"savepoint.{name}"


def checkpoint_epoch_key(app_id: int) -> str:
    """The app's current attempt (epoch), kept for a relaunched AppMaster."""
    return f"{checkpoint_app_prefix(app_id)}.epoch"


def events_key(app_id: int) -> str:
    """What the app's AppMaster recorded of its life (rescales, replacements, restarts), kept
    for a relaunched AppMaster."""
    return f"{checkpoint_app_prefix(app_id)}.events"


def versions_key(app_id: int) -> str:
    """The app's code versions (gearbus replace), kept for a relaunched AppMaster."""
    return f"{checkpoint_app_prefix(app_id)}.versions"


def appmaster_shell_lines(app_id: int | str) -> str:
    """A shell app's executors send their command's lines here."""
    return f"appmaster.{app_id}.shell.lines"


def appmaster_shell_exited(app_id: int | str) -> str:
    """A shell app's executors report their command's end here."""
    return f"appmaster.{app_id}.shell.exited"


def appmaster_shell_output(app_id: int | str) -> str:
    """The master passes a client's ReadShellOutput to the shell app's AppMaster."""
    return f"appmaster.{app_id}.shell.output"


def shell_output_key(app_id: int, executor_id: int) -> str:
    """A shell app's output from one worker (its executor), stored by its AppMaster as the
    app ends, in the checkpoint KV bucket."""
    return f"{checkpoint_app_prefix(app_id)}.shell{executor_id}"


def executor_reregister(app_id: int) -> str:
    """A relaunched AppMaster asks every executor of its app to register with it."""
    return f"executor.{app_id}.reregister"


def executor_control(app_id: int, executor_id: int) -> str:
    """LaunchTasks and StartAllTasks from the AppMaster to one executor."""
    return f"executor.{app_id}.{executor_id}.control"


def task_inbox(app_id: int, processor: int, index: int) -> str:
    """The data inbox of one task: its global address."""
    return f"data.{app_id}.{processor}.{index}"


def task_credit(app_id: int, processor: int, index: int) -> str:
    """Where receivers grant flow-control credit back to one sending task."""
    return f"credit.{app_id}.{processor}.{index}"


def app_state_key(app_id: int) -> str:
    return f"apps.{app_id}"


def worker_state_key(worker_id: str) -> str:
    return f"workers.{worker_id}"


def master_registry_key(master_id: str) -> str:
    return f"master.{master_id}"


NEXT_APP_ID_KEY = "next_app_id"
