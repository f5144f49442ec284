"""The task classes behind source and sink processors."""

from __future__ import annotations

import copy

from gearbus.api.task import Record, Task


class DataSourceTask(Task):
    """Drives a DataSource; the executor's source loop calls :meth:`read`."""

    def on_start(self) -> None:
        self.source = copy.deepcopy(self.context.processor.data_source)  # one per task
        self.source.open(self.context)

    def read(self, max_records: int) -> list[Record] | None:
        return self.source.read(max_records)

    def on_stop(self) -> None:
        self.source.close()


class DataSinkTask(Task):
    """Hands every record it receives to a DataSink."""

    def on_start(self) -> None:
        self.sink = copy.deepcopy(self.context.processor.data_sink)  # one per task
        self.sink.open(self.context)
        self._closed = False

    def on_batch(self, records: list[Record]) -> None:
        self.sink.write(records)

    def on_end(self) -> None:
        self._closed = True
        self.sink.close()

    def on_stop(self) -> None:
        if not self._closed:
            self.sink.close()
