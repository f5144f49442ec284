"""The Nexmark sources: each task's share, snapshots that resume with exactly the rest, the
endless generator's pace, and events files whose bad lines are named by number."""

from __future__ import annotations

import itertools
import json
import pickle
import re
import time
from types import SimpleNamespace

import pytest

from gearbus import Pipeline
from gearbus.api.task import TaskContext
from gearbus.connectors import files
from gearbus.nexmark import AUCTION, BID, EVENT, PERSON, EventsFileSource, Generator, GeneratorConfig, \
    GeneratorSource, write_events
from gearbus.connectors.files import CollectSink
from gearbus.nexmark.schema import kind_of
from gearbus.runners import PipelineFailed, TestRunner

CONFIG = GeneratorConfig(seed=3, rate=500)


def context(parallelism=1, index=0, start_ms=0):
    processor = SimpleNamespace(id=0, name="p", parallelism=parallelism, config={})
    return TaskContext(1, "t", processor, index, 0, app_start_ms=start_ms)


def opened(make, parallelism, index):
    source = make()
    source.open(context(parallelism, index))
    return source


def read_rest(source, batch_size=1000):
    records = []
    while (batch := source.read(batch_size)) is not None:
        records += batch
    return records


def every_cut(make, parallelism, batch_sizes=(7, 300, 1)):
    """Each task read batch by batch with a snapshot before every batch; a task restored
    from any snapshot reads exactly the records that followed it. Returns all records."""
    everything = []
    for index in range(parallelism):
        source = opened(make, parallelism, index)
        records, cuts = [], []
        for i in itertools.count():
            cuts.append((len(records), pickle.loads(pickle.dumps(source.snapshot()))))
            batch = source.read(batch_sizes[i % len(batch_sizes)])
            if batch is None:
                break
            records += batch
        source.close()
        for position, state in cuts[::5]:
            restored = opened(make, parallelism, index)
            restored.restore(state)
            assert read_rest(restored, 13) == records[position:]
            restored.close()
        everything += records
    return everything


@pytest.mark.parametrize("kind", [PERSON, AUCTION, BID, EVENT])
def test_generator_tasks_read_each_event_once_and_resume_exactly(kind):
    generator = Generator(CONFIG)
    expected = generator.values(kind, generator.numbers(kind, 0, 3000))[0]
    for parallelism in (1, 3):
        records = every_cut(lambda: GeneratorSource(kind, CONFIG, events=3000), parallelism)
        values = [r.value for r in records]
        assert sorted(map(json.dumps, values)) == sorted(map(json.dumps, expected))
        inner = [v[kind_of(v)] if kind == EVENT else v for v in values]
        assert [r.timestamp for r in records] == [v["dateTime"] for v in inner]


def test_a_generator_snapshot_of_another_share_is_refused():
    source = opened(lambda: GeneratorSource(BID, CONFIG, events=3000), 2, 0)
    state = source.snapshot()
    for other in (opened(lambda: GeneratorSource(BID, CONFIG, events=3000), 2, 1),
                  opened(lambda: GeneratorSource(BID, GeneratorConfig(seed=4), events=3000), 2, 0),
                  opened(lambda: GeneratorSource(AUCTION, CONFIG, events=3000), 2, 0)):
        with pytest.raises(ValueError, match="another share"):
            other.restore(state)


def test_ingestion_time_instead_of_event_time():
    before = int(time.time() * 1000)
    records = read_rest(opened(lambda: GeneratorSource(BID, CONFIG, events=500, event_time=False), 1, 0))
    assert len(records) == 460 and all(r.timestamp >= before for r in records)


def test_the_endless_generator_releases_events_as_they_fall_due():
    source = GeneratorSource(BID, GeneratorConfig(rate=1000))
    source.open(context(2, 1, start_ms=int(time.time() * 1000)))
    first = source.read(100_000)
    assert len(first) < 100  # at 1000 events/s, only the first few are due yet
    assert 0 < source.idle_wait_s() <= 0.06  # an epoch of 50 events lasts 50 ms
    caught_up = GeneratorSource(BID, GeneratorConfig(rate=1000))
    caught_up.open(context(1, 0, start_ms=int(time.time() * 1000) - 10_000))
    assert 9000 < len(caught_up.read(100_000)) < 10_000  # 10 s late: 10,000 events due, 92% bids


@pytest.fixture
def events_file(tmp_path):
    path = write_events(tmp_path / "events.jsonl", 3000, CONFIG)
    return path


@pytest.mark.parametrize("kind", [PERSON, AUCTION, BID, EVENT])
def test_an_events_file_gives_one_kind_and_resumes_exactly(events_file, kind, monkeypatch):
    monkeypatch.setattr(files, "READ_CHUNK_BYTES", 4096)  # many chunks
    generator = Generator(CONFIG)
    expected = generator.values(kind, generator.numbers(kind, 0, 3000))[0]
    for parallelism in (1, 2):
        values = [r.value for r in every_cut(lambda: EventsFileSource(events_file, kind), parallelism)]
        assert values == expected  # file order, the tasks' splits in order


def test_the_dump_of_a_run_is_the_events_file(tmp_path):
    dumped = []
    p = Pipeline("dump", parallelism=2)
    p.source(GeneratorSource(EVENT, CONFIG, events=2000), name="events").sink(CollectSink(dumped), name="dump")
    TestRunner().run(p)
    path = write_events(tmp_path / "e.jsonl", 2000, CONFIG)
    with open(path, encoding="utf-8") as f:
        assert sorted(map(json.dumps, dumped)) == sorted(line.rstrip("\n") for line in f)


BAD_LINES = [
    ('{"event_type": 2, "person": null, "auction": null}', "missing bid"),
    ('{"event_type": 3, "person": null, "auction": null, "bid": null}', "event_type must be 0 (person), 1"),
    ('{"event_type": 0, "person": null, "auction": null, "bid": null}', "needs 'person' to be an object"),
    ('[1, 2]', "expected a JSON object, got list"),
    ('{"event_type": 2, "person": {}, "auction": null, "bid": {}}', "a bid, but 'person' is not null"),
]


def bid_line(**change) -> str:
    event = Generator(CONFIG).events(4, 5)[0]
    event["bid"].update(change)
    return json.dumps(event)


@pytest.mark.parametrize("line, what", BAD_LINES + [
    (bid_line(price="12"), "bid.price must be an integer, got '12'"),
    (bid_line(dateTime=1.5), "bid.dateTime must be an integer"),
    (bid_line(color="red"), "the bid has unknown color"),
    ('{"event_type": 2, "person": null', "not valid JSON"),
])
def test_a_line_off_the_schema_fails_with_the_file_and_line_number(events_file, line, what, tmp_path):
    with open(events_file, encoding="utf-8") as f:
        lines = f.read().splitlines()
    lines[1730:1730] = ["", line]  # line 1732, after a blank one
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for kind in (PERSON, BID):
        source = opened(lambda: EventsFileSource(path, kind), 1, 0)
        with pytest.raises(ValueError, match=f"^{re.escape(str(path))}:1732: .*{re.escape(what)}"):
            read_rest(source)


def test_a_query_over_a_bad_events_file_fails_naming_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(bid_line() + "\n" + bid_line(auction=None) + "\n", encoding="utf-8")
    p = Pipeline("bad")
    p.source(EventsFileSource(path, BID), name="bids").sink(CollectSink(), name="collect")
    with pytest.raises(PipelineFailed, match=re.escape(f"{path}:2: not a Nexmark event: bid.auction must be an integer")):
        TestRunner().run(p)
