"""The task classes behind source and sink processors: they adapt a DataSource or a
DataSink to the Task interface. They need nothing but the api, and the api's
``Processor.source`` / ``Processor.sink`` name them, so they live here (as Gearpump keeps
its DataSourceTask beside DataSource); the runtime's chained source task extends them."""

from __future__ import annotations

import copy
from operator import itemgetter

from gearbus.api.task import Record, Task
from gearbus.api.watermarks import BoundedOutOfOrderness

_timestamp = itemgetter(1)


class DataSourceTask(Task):
    """Drives a DataSource. The executor's source loop calls :meth:`read`; each batch
    goes through :meth:`on_batch` (which emits it unchanged unless overridden) and the
    processor's watermark generator follows the batch's timestamps, unless the source
    keeps a watermark of its own (per partition, say)."""

    def on_start(self) -> None:
        processor = self.context.processor
        self.source = copy.deepcopy(processor.data_source)  # one per task
        self.source.open(self.context)
        self.watermarks = copy.deepcopy(processor.watermarks or BoundedOutOfOrderness(0))

    def read(self, max_records: int) -> int | None:
        """Read one batch into the output; return how many records were read, None at the end."""
        records = self.source.read(max_records)
        if records is None:
            return None
        if records:
            records = self.stamp(records)
            self.watermarks.observe(max(map(_timestamp, records)))
            self.current_time = records[-1].timestamp
            self.on_batch(records)
        return len(records)

    def stamp(self, records: list[Record]) -> list[Record]:
        """Give records their event time; the source's own timestamps by default."""
        return records

    @property
    def watermark(self) -> int:
        own = self.source.watermark()
        return self.watermarks.current() if own is None else own

    def on_batch(self, records: list[Record]) -> None:
        self.output.extend(records)

    def prepare_checkpoint(self, checkpoint_id: int) -> None:
        self.source.prepare_checkpoint(checkpoint_id)

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        self.source.checkpoint_complete(checkpoint_id)

    def snapshot(self):
        return {"source": self.source.snapshot(), "watermarks": self.watermarks.snapshot()}

    def restore(self, state) -> None:
        self.source.restore(state["source"])
        self.watermarks.restore(state["watermarks"])

    def on_stop(self) -> None:
        self.source.close()


class DataSinkTask(Task):
    """Hands every record it receives to a DataSink, and the sink's two phases to it.
    The sink stays open after the end of its input: the final checkpoint commits."""

    def on_start(self) -> None:
        self.sink = copy.deepcopy(self.context.processor.data_sink)  # one per task
        self.sink.open(self.context)

    def on_batch(self, records: list[Record]) -> None:
        self.sink.write(records)

    def prepare_checkpoint(self, checkpoint_id: int) -> None:
        self.sink.pre_commit(checkpoint_id)

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        self.sink.commit(checkpoint_id)

    def snapshot(self):
        return self.sink.snapshot()

    def restore(self, state) -> None:
        self.sink.restore(state)

    def on_stop(self) -> None:
        self.sink.close()
