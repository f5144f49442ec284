"""A test app that exits as it is imported, as when the host it lands on lacks a file it needs."""

import sys

sys.exit("no model file at /data/model.bin")
