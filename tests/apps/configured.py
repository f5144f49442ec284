"""A test app whose config is its first argument (a JSON object): numbers 0-2 written to
OUTPUT.jsonl, for the checks of a config before an app exists.

    configured.py CONFIG_JSON OUTPUT.jsonl
"""

import json

from gearbus import Pipeline


def application(args):
    p = Pipeline("configured", config=json.loads(args[0]))
    p.from_collection(range(3), name="numbers").write_jsonl(args[1], name="write")
    return p
