"""Helpers the tests share, one module per concern. Tests import them from here, never
from another test module, so a test module can be moved or deleted on its own."""
