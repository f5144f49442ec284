"""How the runtime's machines name a task: (processor id, task index). On the wire a task
is ``shared.messages.TaskId``; ``TaskId(*key)`` and ``(task.processor, task.index)`` convert."""

TaskKey = tuple[int, int]
