"""TextFileSource splits a file among tasks so that every line is read exactly once."""

import pytest

from gearbus import Processor, TextFileSource
from gearbus.api.task import TaskContext
from gearbus.connectors import files


def read_all(path, parallelism):
    processor = Processor.source(TextFileSource(path), parallelism=parallelism)
    processor.id = 0
    lines = []
    for index in range(parallelism):
        source = TextFileSource(path)
        source.open(TaskContext(1, "t", processor, index, 0))
        while (batch := source.read(1000)) is not None:
            lines.extend(r.value for r in batch)
        source.close()
    return lines


CASES = {
    "plain": "a b\nc d\ne\n",
    "no trailing newline": "one\ntwo\nthree",
    "empty lines": "\n\n\nx\n\n",
    "unicode": "naïve 日本語\n😀 😀\nünï\n",
    "long line": "short\n" + "w " * 50_000 + "\nend\n",
    "empty": "",
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("parallelism", [1, 2, 3, 7])
def test_every_line_exactly_once(tmp_path, monkeypatch, name, parallelism):
    monkeypatch.setattr(files, "READ_CHUNK_BYTES", 5)  # force many chunk boundaries
    path = tmp_path / "in.txt"
    path.write_text(CASES[name], encoding="utf-8")
    expected = CASES[name].split("\n")
    if CASES[name].endswith("\n") or not CASES[name]:
        expected.pop()
    assert sorted(read_all(str(path), parallelism)) == sorted(expected)


def test_invalid_utf8_names_the_file_and_offset(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine\nbad \xff byte\n")
    with pytest.raises(ValueError, match=r"bad.txt: not valid UTF-8 near byte 9"):
        read_all(str(path), 1)
