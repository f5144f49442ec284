"""Run a benchmark and put what it printed into docs/benchmarks.md, with the command, the date and the commit.

    python bench/publish.py bench/wordcount.py --repeat 3
    python bench/publish.py --check          # every section names a benchmark that exists

Each benchmark has one section in docs/benchmarks.md, between ``<!-- bench:NAME -->`` and
``<!-- /bench:NAME -->`` (NAME: the script's name without ``.py``): a run replaces its own
section and leaves the others as they are, so the page holds the current table of each
benchmark and no history (git has that). What goes in is the benchmark's standard output,
as it printed it; its progress on standard error shows as it runs. A benchmark that exits
non-zero publishes nothing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs", "benchmarks.md")
SECTION = re.compile(r"<!-- bench:(?P<name>[\w-]+) -->\n.*?<!-- /bench:(?P=name) -->\n", re.S)


def commit() -> str:
    """The commit measured, marked when the working tree differs from it (but for this page,
    which an earlier publish may have left uncommitted: it is not what is measured)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":(exclude)docs/benchmarks.md"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.strip()
    return f"{head} with uncommitted changes" if dirty else head


def machine() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{os.cpu_count()} cores" + (f", {model}" if model else "")


def section(name: str, command: list[str], printed: str, when: datetime.datetime) -> str:
    return (f"<!-- bench:{name} -->\n## {name}\n\n"
            f"`{shlex.join(command)}`, {when:%Y-%m-%d %H:%M} UTC, commit {commit()}, {machine()}:\n\n"
            f"```\n{printed.strip()}\n```\n<!-- /bench:{name} -->\n")


def replace_section(page: str, name: str, text: str) -> str:
    """``page`` with the section of ``name`` replaced by ``text`` (appended when new, the
    sections kept in order of name)."""
    sections = {m["name"]: m.group(0) for m in SECTION.finditer(page)}
    head = SECTION.split(page, maxsplit=1)[0] if sections else page.rstrip("\n") + "\n\n"
    sections[name] = text
    return head + "\n".join(sections[n] for n in sorted(sections))


def check() -> list[str]:
    """Sections whose benchmark script is gone."""
    with open(DOCS, encoding="utf-8") as f:
        names = [m["name"] for m in SECTION.finditer(f.read())]
    return [f"docs/benchmarks.md has a section {n} but bench/{n}.py does not exist"
            for n in names if not os.path.isfile(os.path.join(REPO, "bench", f"{n}.py"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check the page's sections")
    parser.add_argument("benchmark", nargs="?", help="the benchmark script, bench/NAME.py")
    parser.add_argument("args", nargs="...", help="its arguments")
    opts = parser.parse_args(argv)
    if opts.check:
        problems = check()
        print("\n".join(problems) or "docs/benchmarks.md: every section has its benchmark")
        return 1 if problems else 0
    if opts.benchmark is None:
        parser.error("name a benchmark, e.g. bench/wordcount.py")
    script = os.path.relpath(os.path.abspath(opts.benchmark), REPO)
    name = os.path.basename(script).removesuffix(".py")
    if os.path.dirname(script) != "bench" or not os.path.isfile(os.path.join(REPO, script)):
        parser.error(f"{opts.benchmark} is not a benchmark under bench/")
    command = ["python", script, *opts.args]
    when = datetime.datetime.now(datetime.timezone.utc)
    run = subprocess.run([sys.executable, os.path.join(REPO, script), *opts.args], cwd=REPO, stdout=subprocess.PIPE,
                         text=True)
    sys.stdout.write(run.stdout)
    if run.returncode != 0:
        print(f"publish: {script} exited {run.returncode}; docs/benchmarks.md left as it was", file=sys.stderr)
        return run.returncode
    with open(DOCS, encoding="utf-8") as f:
        page = f.read()
    text = section(name, command, run.stdout, when)  # first: the page opened for writing marks the commit changed
    with open(DOCS, "w", encoding="utf-8") as f:
        f.write(replace_section(page, name, text))
    print(f"publish: docs/benchmarks.md section {name} written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
