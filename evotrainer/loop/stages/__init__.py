"""The stages of a generation, in the order `Experiment.run_generation` runs them: the start (the untrained
model's record), propose (with merge children), train and verify, gate, select (with its descriptor archive,
the exploit phase, continuations and reverts), and the final pick."""
