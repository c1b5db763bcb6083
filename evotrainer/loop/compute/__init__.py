"""Where the stages' compute runs: the executor seam (local, or Ray workers each holding a `BranchWorker`),
the runtime (model, engine, domain, tasks) and one-branch training outside a run."""
