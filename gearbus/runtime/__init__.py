"""The engine both the executor and the TestRunner drive: the I/O-free task core, the
source and sink tasks, chained operators and their state."""
