"""Where a gearbus run's CPU goes: a py-spy profile of every process of the run, each sample
put in one cost category by the frames on its stack.

py-spy (``pip install py-spy``) samples every Python process of the run from outside
(``--subprocesses``), only the thread holding the GIL (``--gil``): a sample is time spent
running Python or C called from Python, not time waiting on a socket, whichever thread
waits. A sample's category is decided in this order:

1. the process: samples outside executors are the control plane (master, workers, the
   AppMaster, the client), importing modules anywhere is start-up;
2. the whole stack: anything under taking, encoding or storing a snapshot, aligning a
   barrier or committing a checkpoint is checkpoints;
3. the innermost frame that a rule in :data:`RULES` knows, from the leaf up: a user
   function calling ``json.loads`` is reading, the engine calling a user function is a
   user function.

Frames py-spy cannot see (C code without Python frames above it in its own file, such as
``operator.itemgetter``) count for the Python frame that called them.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import sys

#: The costs of processing events, in the order the table prints them.
CATEGORIES = ("reading+JSON", "schema checks", "user functions", "engine per record", "frame codec", "bus",
              "checkpoints", "sink", "other")
#: The master, the workers, the AppMaster and the client: a cost per second of the run.
CONTROL_PLANE = "control plane"
#: Importing modules, in any process: a cost per run.
START_UP = "start-up"
#: Costs of a run, not of its events.
PER_RUN = (CONTROL_PLANE, START_UP)

_CHECKPOINT_FILES = ("gearbus/runtime/snapshots.py", "gearbus/runtime/keygroups.py", "gearbus/runtime/checkpoints.py",
                     "services/checkpoint_store.py", "gearbus/runtime/savepoints.py")
_CHECKPOINT_FUNCTIONS = re.compile(r"(snapshot|_barrier|inject|commit|checkpoint)", re.IGNORECASE)

#: (category, file pattern, function pattern or None): the first that matches a frame wins.
RULES = (
    ("schema checks", re.compile(r"gearbus/nexmark/schema\.py$"), None),
    ("sink", re.compile(r""), re.compile(r"DiscardSink|DataSinkTask|JsonLinesSink")),
    ("user functions", re.compile(r"(^|/)q\d+\.py$|gearbus/nexmark/(query|winning_bids|__init__)\.py$"), None),
    ("user functions", re.compile(r"gearbus/nexmark/sources\.py$"), re.compile(r"OfKind")),
    ("reading+JSON", re.compile(r"(^|/)json/|gearbus/connectors/files\.py$|gearbus/nexmark/sources\.py$|codecs\.py$"),
     None),
    ("frame codec", re.compile(r"(^|/)msgpack/|shared/values\.py$|gearbus/runtime/frames\.py$"), None),
    ("bus", re.compile(r"(^|/)nats/|(^|/)asyncio/|selectors\.py$|uvloop|gearbus/runtime/sender\.py$"
                       r"|services/executor/outputs\.py$|socket\.py$"), None),
    ("engine per record", re.compile(r"gearbus/|services/executor/"), None),
)

_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*):\d+\)$")


def py_spy() -> str | None:
    """The py-spy command (beside this Python first, as pip installs it), or None."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else shutil.which("py-spy")


def record_command(output: str, rate_hz: int) -> list[str]:
    """The py-spy command line that profiles a command and all its subprocesses into ``output``."""
    return [py_spy() or "py-spy", "record", "--subprocesses", "--gil", "--format", "raw", "--rate", str(rate_hz),
            "--output", output, "--"]


def category(stack: list[str]) -> str:
    """The cost category of one sample's stack (root first, py-spy's ``process N:"cmd"``
    frames among them)."""
    processes = [frame for frame in stack if frame.startswith("process ")]
    if any("<frozen importlib" in frame for frame in stack):
        return START_UP
    if not processes or "services.executor" not in processes[-1]:
        return CONTROL_PLANE
    frames = [m for m in (_FRAME.match(frame) for frame in stack) if m]
    if any(m["file"] in _CHECKPOINT_FILES or _CHECKPOINT_FUNCTIONS.search(m["function"]) for m in frames):
        return "checkpoints"
    for m in reversed(frames):
        for name, files, functions in RULES:
            if files.search(m["file"]) and (functions is None or functions.search(m["function"])):
                return name
    return "other"


def split(raw_path: str) -> collections.Counter:
    """Samples per category in a py-spy raw profile (``stack count`` lines)."""
    counts = collections.Counter()
    with open(raw_path, encoding="utf-8", errors="replace") as profile:
        for line in profile:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack and count.isdigit():
                counts[category(stack.split(";"))] += int(count)
    return counts
