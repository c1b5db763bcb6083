"""The run's sqlite MLflow store, created whole or not at all.

MLflow builds a new sqlite store by running its migrations, a few seconds of DDL. A process stopped
in between (Ctrl-C, kill -9) used to leave a store with some of its tables, which every later open
tried to build again ("table registered_models already exists"): the run could never be resumed.
The store is now built under a temporary name and renamed into place, and a half-built store from
before is moved aside (it cannot hold a record: nothing is written before its tables exist);
``resume`` then records every version into the new one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable


def ensure_sqlite_store(path: Path, say: Callable[[str], None] = lambda msg: None) -> None:
    """Makes ``path`` a complete MLflow sqlite store (building it if it is missing or half-built)."""
    import sqlalchemy
    from mlflow.store.db.utils import _all_tables_exist

    if path.is_file():
        engine = sqlalchemy.create_engine(f"sqlite:///{path}")
        try:
            tables = sqlalchemy.inspect(engine).get_table_names()
            complete = _all_tables_exist(engine)
        finally:
            engine.dispose()
        if complete:
            return
        if tables:
            aside = path.with_name(f"{path.name}.half-built-{time.strftime('%Y%m%d-%H%M%S')}")
            os.replace(path, aside)
            say(f"{path} was a half-built MLflow store ({len(tables)} tables: a process stopped while creating "
                f"it); moved aside to {aside.name}, building it again")
    _build(path)


def _build(path: Path) -> None:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    tmp = path.with_name(path.name + ".partial")
    tmp.unlink(missing_ok=True)     # what a process stopped while building it left
    store = SqlAlchemyStore(f"sqlite:///{tmp}", (path.parent / "mlartifacts").as_uri())
    store.engine.dispose()
    os.replace(tmp, path)
