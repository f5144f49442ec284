"""What the benchmarks share: their command-line help and the check of counted output."""

from __future__ import annotations

import argparse
import collections


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown, and the module docstring kept as written."""


def parser_from_doc(doc: str) -> argparse.ArgumentParser:
    """A parser whose description is the docstring's first paragraph and whose epilog is
    everything after its second (the usage block)."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=HelpFormatter,
                                   epilog=doc.split("\n\n", 2)[2])


def count_problems(got: dict, expected: collections.Counter, what: str) -> list[str]:
    """What differs between counted output and the independent count, a few of each kind."""
    problems = []
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    wrong = [k for k in expected if k in got and got[k] != expected[k]]
    if missing:
        problems.append(f"{len(missing)} {what} missing, e.g. " + ", ".join(f"{k}={expected[k]}" for k in missing[:5]))
    if extra:
        problems.append(f"{len(extra)} unexpected {what}, e.g. " + ", ".join(f"{k}={got[k]}" for k in extra[:5]))
    if wrong:
        problems.append(f"{len(wrong)} wrong counts, e.g. "
                        + ", ".join(f"{k}: got {got[k]} want {expected[k]}" for k in wrong[:5]))
    return problems
