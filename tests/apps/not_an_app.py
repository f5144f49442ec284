"""A Python file that defines no application() function."""

VALUE = 1
