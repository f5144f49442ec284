"""A test app whose import fails in its executors only, as when their hosts lack a file the
app needs: the AppMaster plans it, then every executor's start fails."""

import os
import sys

from gearbus import Application, CollectionSource, Graph, Processor

if sys.argv[0].endswith(os.path.join("executor", "__main__.py")):  # python -m services.executor
    raise FileNotFoundError("no model file at /data/model.bin")


def application(args):
    graph = Graph()
    graph.add(Processor.source(CollectionSource(range(10)), name="numbers"))
    return Application("executors-cannot-load", graph)
