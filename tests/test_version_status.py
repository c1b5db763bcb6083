"""A version's status is a ``Status``: stored in meta.json as its plain value, compared with strings
as before, and a record with a status the code does not know is refused with its name."""

import json

import pytest

from evotrainer.records.run_dir import RunDirError
from evotrainer.records.version import SETTLED, BranchVersion, Status, VersionDir


def test_a_status_round_trips_as_its_plain_value(tmp_path):
    vd = VersionDir(tmp_path / "v0001")
    vd.save_meta(BranchVersion(id="v0001", base_model="m", genome_hash="h", status="kept"))
    assert json.loads((vd.path / "meta.json").read_text())["status"] == "kept"
    meta = vd.meta()
    assert meta.status is Status.KEPT and meta.status == "kept" and f"{meta.status}" == "kept"
    assert meta.status in SETTLED and Status.PRUNED not in SETTLED
    assert {"kept": 1}.get(meta.status) == 1          # a string-keyed table still finds it


def test_an_unknown_status_is_named(tmp_path):
    vd = VersionDir(tmp_path / "v0002")
    vd.path.mkdir(parents=True)
    (vd.path / "meta.json").write_text(json.dumps({"id": "v0002", "base_model": "m", "genome_hash": "h",
                                                    "status": "half-done"}))
    with pytest.raises(RunDirError, match="'half-done' is not one of pending"):
        vd.meta()
