"""The leaderboard a run prints fits an 80-column terminal without splitting words ("versio / n",
"refute / d" was what a default terminal showed); only a long factor folds."""

import io

from rich.console import Console

from evotrainer.loop.tools.summary import leaderboard
from evotrainer.records.version import BranchVersion


def _meta(vid, gen, op, factor, gate, status, verdict):
    return BranchVersion(id=vid, base_model="smollm2-135m", genome_hash="h" + vid, parents=[], generation=gen,
                         metrics={"heldout_accuracy": gate, "selection_accuracy": gate - 0.05,
                                  "train_reward_mean": 0.4},
                         status=status, created=1_700_000_000, operator=op, factor=factor,
                         hypothesis={"verdict": verdict} if verdict else None)


def test_the_leaderboard_fits_80_columns_and_splits_no_word():
    metas = [_meta("v0000", 0, None, None, 0.25, "kept", None),
             _meta("v0007", 3, "llm_choice", "hook:advantages", 0.375, "promoted", "confirmed"),
             _meta("v0012", 4, "crossover", "knob:max_completion_length", 0.333, "pruned", "untestable"),
             _meta("v0013", 4, "library", "knob:scale_rewards", 0.20, "invalid", "refuted")]
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(leaderboard("leaderboard — runs/quickstart", metas))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    text = out.getvalue()
    # one space between columns leaves the factor room for a knob name of a real run, whole
    for word in ("operator", "hypothesis", "status", "promoted", "untestable", "llm_choice", "knob:max_comp",
                 "knob:scale_rewards", "crossover", "v0012", "0.375"):
        assert word in text, (word, text)
    assert [line.split()[0] for line in lines if line.strip().startswith("v00")] == ["v0007", "v0012", "v0000", "v0013"]
