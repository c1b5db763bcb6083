"""The human gates: where a run pauses for a person's decision, and what each pause shows."""
