"""The engine both the executor and the TestRunner drive: the I/O-free task core,
chained operators, window operators and their state."""
