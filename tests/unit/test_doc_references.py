"""Every document the code and the docs cite is in the repository: a reader can follow it."""

from __future__ import annotations

import os
import re

from tests.support.paths import REPO

CITED = re.compile(r"(?<![\w./'\"-])[\w./-]+\.md\b")  # in prose and links (a quoted one is a path in code)
SKIPPED_DIRS = {"node_modules", "build", "dist"}


def repository_files():
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        for name in files:
            if name.endswith((".py", ".md", ".yaml", ".toml")):
                yield os.path.join(root, name)


def test_every_cited_document_exists():
    missing = []
    for path in repository_files():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for cited in set(CITED.findall(text)):
            if not any(os.path.exists(os.path.join(base, cited)) for base in (REPO, os.path.dirname(path))):
                missing.append(f"{os.path.relpath(path, REPO)} cites {cited}")
    assert not missing, "\n".join(sorted(missing))
