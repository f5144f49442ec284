"""What decides without I/O: the typed application config (more of the state machines move
here in time)."""
