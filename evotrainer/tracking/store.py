"""The run's sqlite MLflow store, created whole or not at all.

MLflow builds a new sqlite store by running its migrations, a few seconds of DDL. A process stopped
in between (Ctrl-C, kill -9) would leave a store with some of its tables, which every later open
would try to build again ("table registered_models already exists"), so the run could never be
resumed. The store is therefore built under a temporary name and renamed into place. An existing store is opened
by MLflow, which upgrades one an older MLflow made; only one that MLflow cannot open because it is
half-built is moved aside (it cannot hold a record: nothing is written before its tables exist),
and ``resume`` records every version into the new one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable


def ensure_sqlite_store(path: Path, say: Callable[[str], None] = lambda msg: None) -> None:
    """Makes ``path`` a complete MLflow sqlite store (building it if it is missing or half-built)."""
    if path.is_file():
        try:
            _open(path)
            return
        except Exception as e:   # noqa: BLE001 - only a half-built store is handled; anything else is raised
            if "already exists" not in str(e):
                raise
            aside = path.with_name(f"{path.name}.half-built-{time.strftime('%Y%m%d-%H%M%S')}")
            os.replace(path, aside)
            say(f"{path} was a half-built MLflow store (a process stopped while creating it: {str(e).splitlines()[0][:120]}); "
                f"moved aside to {aside.name}, building it again")
    tmp = path.with_name(f"{path.name}.partial-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    _open(tmp)
    os.replace(tmp, path)
    for stale in path.parent.glob(f"{path.name}.partial*"):   # what a process stopped while building left
        stale.unlink(missing_ok=True)


def _open(db: Path) -> None:
    """Creates or upgrades the store in ``db`` as MLflow's own SqlAlchemyStore does, on an engine of
    its own (MLflow caches one per URI, whose connection would outlive a store moved aside)."""
    import sqlalchemy
    from mlflow.store.db.utils import _all_tables_exist, _initialize_tables

    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    try:
        if not _all_tables_exist(engine):
            _initialize_tables(engine)
    finally:
        engine.dispose()
