"""Where the repository's files are, for tests that hand apps and examples to real processes."""

from __future__ import annotations

import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples")
APPS = os.path.join(REPO, "tests", "apps")
WORDCOUNT = os.path.join(EXAMPLES, "wordcount.py")
TICKER = os.path.join(EXAMPLES, "ticker.py")
