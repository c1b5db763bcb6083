"""The run's MLflow store is created whole or not at all, and a half-built one does not block resume."""

import sqlite3

from evotrainer.tracking.lineage import LineageTracker
from evotrainer.tracking.store import ensure_sqlite_store


def test_a_store_left_half_built_by_a_stopped_process_is_moved_aside_and_built_again(tmp_path):
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:   # what a Ctrl-C during MLflow's migrations leaves: some of its tables
        con.execute("CREATE TABLE registered_models (name VARCHAR(256) PRIMARY KEY)")
        con.execute("CREATE TABLE secrets (id INTEGER PRIMARY KEY)")
    said = []
    tracker = LineageTracker(tmp_path, say=said.append)
    assert tracker.client.get_experiment(tracker.experiment_id).name   # a working store
    aside = [p.name for p in tmp_path.iterdir() if p.name.startswith("mlflow.db.half-built-")]
    assert len(aside) == 1 and said and "half-built MLflow store" in said[0] and aside[0] in said[0]
    ensure_sqlite_store(db, said.append)   # complete now: left alone, nothing said
    assert len(said) == 1


def test_a_store_is_built_under_a_temporary_name_and_renamed_in(tmp_path):
    db = tmp_path / "mlflow.db"
    (tmp_path / "mlflow.db.partial-12345").write_bytes(b"what a killed build left")
    ensure_sqlite_store(db)
    assert db.is_file() and not list(tmp_path.glob("mlflow.db.partial*"))
    with sqlite3.connect(db) as con:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"experiments", "runs", "registered_models"} <= names


def test_a_complete_store_missing_newer_tables_is_left_to_mlflow_not_moved_aside(tmp_path):
    """What an older MLflow made lacks the tables a newer one adds, and MLflow upgrades it in place:
    such a store (with records in it) is opened as MLflow opens it, never taken for a half-built one."""
    db = tmp_path / "mlflow.db"
    ensure_sqlite_store(db)
    with sqlite3.connect(db) as con:
        con.execute("INSERT INTO experiments (name, lifecycle_stage) VALUES ('kept', 'active')")
        con.execute("DROP TABLE secrets")
    said = []
    ensure_sqlite_store(db, said.append)
    assert said == [] and not list(tmp_path.glob("mlflow.db.half-built-*"))
    with sqlite3.connect(db) as con:
        kept = con.execute("SELECT count(*) FROM experiments WHERE name='kept'").fetchone()[0]
    assert kept == 1
