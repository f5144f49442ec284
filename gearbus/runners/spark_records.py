"""What the Spark runner's translations share about records: they are ``(value,
timestamp, key)`` tuples, as on the bus, with a fourth item where a step computed the
watermark in force at their arrival (CARRIED); and a failure of user code inside Spark's
Python workers (StepFailure), worded so the driver can name the step and the record."""

from __future__ import annotations

STEP_FAILURE = "gearbus step failure"
#: A step's watermark setting when its records carry the watermark in force at their
#: arrival as a fourth item (computed at a JetStream source, per subject, as the bus does).
CARRIED = "carried"


class StepFailure(Exception):
    """Raised inside Spark's Python workers when user code fails; its text survives the
    JVM round trip, so the driver can name the step and the record."""

    def __init__(self, step: str, value, original: BaseException):
        shown = repr(value)
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        super().__init__(f"{STEP_FAILURE} [{type(original).__name__}] {original} (step {step!r} on record {shown})")
