"""A test app that leaves a marker file wherever it is built: proof that a process ran it."""

import argparse

from gearbus import Application, CollectionSource, Graph, Processor


def application(args):
    parser = argparse.ArgumentParser(prog="marker")
    parser.add_argument("--marker", required=True, help="file to create")
    path = parser.parse_args(args).marker
    with open(path, "a") as f:
        f.write("ran\n")
    graph = Graph()
    graph.add(Processor.source(CollectionSource(range(3)), name="numbers"))
    return Application("marker", graph)
