"""Tools around a run: re-running a recorded version and comparing it with its record, the run's summary,
and `validate_resources` (everything a config names, checked before any compute)."""
