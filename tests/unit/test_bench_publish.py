"""bench/publish.py keeps one section per benchmark in docs/benchmarks.md: a run replaces
its own section and no other, and every section names a benchmark that exists."""

from __future__ import annotations

import datetime

from bench import publish

WHEN = datetime.datetime(2026, 12, 7, 15, 0, tzinfo=datetime.timezone.utc)
HEAD = "# Benchmarks\n\nIntro.\n"


def test_a_run_replaces_its_own_section_only():
    page = publish.replace_section(HEAD, "wordcount", publish.section("wordcount", ["python", "bench/wordcount.py"],
                                                                      "old table\n", WHEN))
    page = publish.replace_section(page, "latency", publish.section("latency", ["python", "bench/latency.py"],
                                                                    "latency table\n", WHEN))
    page = publish.replace_section(page, "wordcount", publish.section(
        "wordcount", ["python", "bench/wordcount.py", "--repeat", "3"], "new table\n", WHEN))
    assert page.startswith(HEAD)
    assert "old table" not in page and "new table" in page and "latency table" in page
    assert page.count("<!-- bench:wordcount -->") == 1
    assert "`python bench/wordcount.py --repeat 3`, 2026-12-07 15:00 UTC, commit " in page
    assert page.index("bench:latency") < page.index("bench:wordcount")  # in order of name


def test_every_published_section_has_its_benchmark():
    assert publish.check() == []
