"""A test app whose tasks print: two tasks each print every number they see, then the
numbers are counted by parity and written to a file (args: OUTPUT [COUNT])."""

from gearbus import Pipeline


def shout(n):
    print(f"map saw {n}")
    return n


def application(args):
    count = int(args[1]) if len(args) > 1 else 20
    p = Pipeline("printing", parallelism=2, config={"executors": 2})
    (p.from_collection(range(count), name="numbers")
      .map(shout, name="shout")
      .group_by(lambda n: n % 2, name="parity")
      .count(name="count")
      .map(lambda r: {"parity": r.key, "count": r.value}, name="format")
      .write_jsonl(args[0], name="write"))
    return p
