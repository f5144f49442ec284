"""How many examples a fuzz test draws. The full budget runs under the "ci" hypothesis
profile (tests/conftest.py loads it when the environment sets CI, as CI services do); the
"dev" profile of a local run draws a tenth of it, so `pytest -m unit` stays well under a
minute. Hypothesis draws new examples each run, so local runs still add up."""

from __future__ import annotations

from hypothesis import settings

FULL_PROFILE = "ci"
QUICK_PROFILE = "dev"
QUICK_SHARE = 10


def examples(full: int) -> int:
    """``full`` under the ci profile, a tenth of it (at least one) under any other."""
    if settings.get_current_profile_name() == FULL_PROFILE:
        return full
    return max(1, full // QUICK_SHARE)
