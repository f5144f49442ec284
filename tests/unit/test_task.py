"""Task emission: records carry the latest input time unless told otherwise."""

from gearbus import CollectionSource, Processor, Record, Task
from gearbus.api.task import TaskContext


class Echo(Task):
    def on_next(self, record):
        self.emit(record.value, key="k")


def make(task_class):
    processor = Processor.source(CollectionSource([]), name="p")
    processor.id = 0
    return task_class(TaskContext(1, "app", processor, 0, 0))


def test_emit_defaults_to_the_input_record_time():
    task = make(Echo)
    task.on_batch([Record("a", 10), Record("b", 20)])
    assert task.output == [Record("a", 10, "k"), Record("b", 20, "k")]
    assert all(type(r) is Record for r in task.output)


def test_emit_keyed_sends_one_record_per_pair():
    task = make(Echo)
    task.current_time = 5
    task.emit_keyed({"x": 1, "y": 2}.items())
    task.emit_keyed([("z", 3)], timestamp=9)
    assert task.output == [Record(1, 5, "x"), Record(2, 5, "y"), Record(3, 9, "z")]
    assert task.output[0].key == "x" and task.output[0].value == 1
