"""The DSL's connector steps: ``gearbus.Pipeline`` is the api's Pipeline with steps that
read and write through the connectors here (text and JSON Lines files, collections,
JetStream, core NATS), and its streams have the matching writes. The api describes steps
over any DataSource and DataSink and imports no connector; this layer names them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from gearbus.api import dsl
from gearbus.api.graph import GraphError
from gearbus.api.steps import Sink, Step
from gearbus.connectors.files import CollectionSource, JsonLinesSink, JsonLinesSource, TextFileSource
from gearbus.connectors.jetstream import JetStreamTransactionalSink
from gearbus.connectors.jetstream_source import JetStreamSource, NatsSubjectSource


class Pipeline(dsl.BasePipeline):
    """A logical streaming graph with read steps for every connector gearbus ships."""

    def _stream_of(self, step: Step) -> Stream:
        return Stream(self, step)

    def read_text(self, path: str, **kwargs) -> Stream:
        """Each line of a UTF-8 text file (without the newline) is one record; a relative
        ``path`` is in the directory the app is submitted from, on every runner."""
        return self._source(TextFileSource(path), "read_text", **kwargs)

    def read_jsonl(self, path: str, **kwargs) -> Stream:
        """Each line of a JSON Lines file, parsed, is one record (``path`` as for :meth:`read_text`)."""
        return self._source(JsonLinesSource(path), "read_jsonl", **kwargs)

    def from_collection(self, items: Iterable[Any], **kwargs) -> Stream:
        """The items of a Python collection, in order."""
        return self._source(CollectionSource(items), "collection", **kwargs)

    def read_jetstream(self, stream: str, subjects: str | list[str] | None = None, *, start="first", until=None,
                       decode="json", timestamp_fn: Callable[[Any], int] | None = None,
                       max_out_of_orderness_ms: int = 0, parallelism: int | None = None, name: str | None = None,
                       servers: str | list[str] | None = None, dead_letter: str | None = None,
                       creds: str | None = None) -> Stream:
        """The messages of a JetStream stream (its subjects matching ``subjects``, each read
        by the task owning its hash, also those that appear while the app runs: the stream
        may start empty), replayed exactly on recovery. ``start``: "first", "new", a stream
        sequence or a datetime; ``until``: None (endless), "now" or a sequence. Messages
        that do not decode go to ``dead_letter`` (a subject) instead of failing the task.
        ``servers`` default to the cluster's NATS; ``creds``: the credential file to read
        with on a secure cluster (the same path on every worker). Event time is
        ``timestamp_fn(value)`` or the stream's timestamp; the watermark is kept per subject."""
        try:
            source = JetStreamSource(stream, subjects, start=start, until=until, decode=decode,
                                     timestamp_fn=timestamp_fn, max_out_of_orderness_ms=max_out_of_orderness_ms,
                                     servers=servers, dead_letter=dead_letter, creds=creds)
        except ValueError as exc:
            raise GraphError(f"read_jetstream {name or stream!r}: {exc}") from None
        # The source stamps its records and keeps the watermark; the step's own generator
        # (same delay) only stands in before the first record.
        return self._source(source, "read_jetstream", name=name,
                            parallelism=self.parallelism if parallelism is None else parallelism,
                            max_out_of_orderness_ms=max_out_of_orderness_ms)

    def read_nats(self, subject: str, *, decode="json", queue: str | None = None, parallelism: int = 1,
                  name: str | None = None, servers: str | list[str] | None = None, creds: str | None = None) -> Stream:
        """The messages published on a core-NATS subject from now on: at-most-once (nothing
        is kept while the task is down) and endless; event time is the arrival time.
        ``creds`` as for :meth:`read_jetstream`."""
        try:
            source = NatsSubjectSource(subject, decode=decode, queue=queue, servers=servers, creds=creds)
        except ValueError as exc:
            raise GraphError(f"read_nats {name or subject!r}: {exc}") from None
        return self._source(source, "read_nats", name=name, parallelism=parallelism)


class Stream(dsl.BaseStream):
    """A stream of records produced by one step, with write steps for the connectors."""

    def write_jsonl(self, path: str, name: str | None = None) -> None:
        """Write each value as a JSON line to one file (a relative ``path`` is in the
        directory the app is submitted from)."""
        sink = JsonLinesSink(path)
        sink.step = self._then(Sink, name, 1, "write_jsonl", data_sink=sink).step.name

    def write_jetstream(self, subject: str, *, stream: str | None = None, id_fn: Callable[[Any], Any] | None = None,
                        name: str | None = None, servers: str | list[str] | None = None,
                        creds: str | None = None) -> None:
        """Publish each value as JSON to a JetStream subject, exactly once: what arrives
        between checkpoints is published when its checkpoint completes, under message ids
        from its position (or ``id_fn(value)``), deduplicated by the stream. ``stream``:
        create that stream if missing. Runs in the tasks of the step before it. ``creds`` as
        for :meth:`Pipeline.read_jetstream`."""
        self._then(Sink, name, None, "write_jetstream",
                   data_sink=JetStreamTransactionalSink(subject, stream=stream, id_fn=id_fn, servers=servers,
                                                        creds=creds))
