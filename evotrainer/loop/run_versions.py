"""A run's version directories, ``<run>/versions/<id>``: what the stages look versions up in.

A stage that takes this (not the whole ``Experiment``) can be run on version directories written by
hand, without a config, a run state or a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evotrainer.records.version import BranchVersion, VersionDir


@dataclass(frozen=True)
class RunVersions:
    root: Path   # <run>/versions

    def vdir(self, vid: str) -> VersionDir:
        return VersionDir(self.root / vid)

    def ids(self) -> list[str]:
        """Every version with a meta.json, in id order."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "meta.json").is_file())

    def of_generation(self, generation: int) -> list[str]:
        return [v for v in self.ids() if self.vdir(v).meta().generation == generation]

    def meta_or_none(self, vid: str) -> BranchVersion | None:
        """A version's record, or None when it has none (a lineage walk meeting a removed ancestor)."""
        vd = self.vdir(vid)
        return vd.meta() if (vd.path / "meta.json").is_file() else None
