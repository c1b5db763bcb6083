"""One error policy for the command line: each case runs the real CLI in a subprocess and must end
in one or two lines that name the file or field, exit 1 or 2, and never show a traceback."""

import os
from pathlib import Path

import pytest
import yaml

from evotrainer.genome.program import reference_program
from tests.cli_process import REFERENCE, cli
from tests.loop_runs import tiny_cfg


def train_cfg(tmp: Path, **over) -> Path:
    cfg = {**tiny_cfg(tmp / "out"), "train": {"steps": 1, "prompts_per_step": 2, "eval_max_new_tokens": 4}}
    for key, value in over.items():   # "domain.files" -> cfg["domain"]["files"]
        *parents, last = key.split(".")
        node = cfg
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def genome_with(tmp: Path, old: str, new: str) -> Path:
    src = reference_program().source
    assert old in src
    (tmp / "g.py").write_text(src.replace(old, new))
    return tmp / "g.py"


def a_run(tmp: Path, damage: str | None = None) -> Path:
    """A run directory as `evotrainer run` leaves it after its first save, optionally damaged."""
    from evotrainer.config import parse_config
    from evotrainer.loop.experiment import Experiment
    from evotrainer.loop.versions import new_version

    run = tmp / "run"
    exp = Experiment(parse_config(tiny_cfg(run)))
    exp.state.live = [new_version(exp, None, exp.seed_program().source, 0)]
    exp.save()
    exp.close()
    if damage:
        path = run / damage
        path.write_text(path.read_text()[:20])   # truncated mid-write
    return run


def retyped(tmp: Path, **fields) -> Path:
    """A run whose state.json holds fields of the wrong type (edited by hand, or damaged)."""
    import json

    run = a_run(tmp)
    state = json.loads((run / "state.json").read_text())
    (run / "state.json").write_text(json.dumps({**state, **fields}))
    return run


def garbage(tmp: Path) -> Path:
    (tmp / "junk").mkdir()
    (tmp / "junk" / "notes.txt").write_text("not a run")
    return tmp / "junk"


def binary(tmp: Path, name: str) -> Path:
    (tmp / name).write_bytes(b"\xff\xfe\x00garbage")
    return tmp / name


def jsonl(tmp: Path, text: str) -> dict:
    (tmp / "train.jsonl").write_text(text)
    return {"train": str(tmp / "train.jsonl")}


# name -> (argv builder, exit code, text the message must contain)
CASES = {
    "status missing dir": (lambda t: ["status", t / "nope"], 2, "nope"),
    "status garbage dir": (lambda t: ["status", garbage(t)], 2, "junk"),
    "resume garbage dir": (lambda t: ["resume", garbage(t)], 2, "junk"),
    "approve missing dir": (lambda t: ["approve", t / "nope"], 2, "nope"),
    "reject garbage dir": (lambda t: ["reject", garbage(t)], 2, "junk"),
    "status truncated state.json": (lambda t: ["status", a_run(t, "state.json")], 2, "state.json"),
    "status truncated meta.json": (lambda t: ["status", a_run(t, "versions/v0000/meta.json")], 2, "meta.json"),
    "resume truncated config.json": (lambda t: ["resume", a_run(t, "config.json")], 2, "config.json"),
    "train missing harness": (lambda t: ["train", train_cfg(t, harness=str(t / "h.py"))], 2, "h.py"),
    "train harness syntax error": (lambda t: ["train", train_cfg(t, harness=str(genome_with(
        t, "def reward(rollouts, tasks):", "def reward(rollouts, tasks)")))], 2, "g.py"),
    "train missing domain file": (lambda t: ["train", train_cfg(t, **{"domain.files": {"train": "/x/none.jsonl"}})],
                                  2, "none.jsonl"),
    "train bad JSON line": (lambda t: ["train", train_cfg(t, **{"domain.files": jsonl(t, '{"question": "1+1"\n')})],
                            2, "train.jsonl:1"),
    "train difficulty out of range": (lambda t: ["train", train_cfg(t, **{"domain.difficulty": 7})], 2, "difficulty"),
    "train missing model path": (lambda t: ["train", train_cfg(t, model=str(t / "no-model"))], 2, "model"),
    "train bad device": (lambda t: ["train", train_cfg(t, device="cuda:7")], 2, "device"),
    "train garbled device": (lambda t: ["train", train_cfg(t, device="gpu-please")], 2, "device"),
    "train bad LoRA target": (lambda t: ["train", train_cfg(t, **{"lora.target_modules": ["qq_proj"]})],
                              2, "qq_proj"),
    "train harness fails at runtime": (lambda t: ["train", train_cfg(t, harness=str(genome_with(
        t, 'return [1.0 if r["visible"].get("correct") else 0.0 for r in rollouts]', "return [1 / 0]")))],
        1, "ZeroDivisionError"),
    "run unknown operator": (lambda t: ["run", train_cfg(t, **{"evolution.operators": {"knobz": 1.0}})],
                             2, "knobz"),
    "run unsandboxed with llm operators": (lambda t: ["run", train_cfg(t, sandbox=False, **{
        "evolution.operators": {"llm_diff": 1.0}})], 2, "sandbox"),
    # An empty config is valid now (its split defaults fit the generator); asking for more level-1
    # problems than exist is the error, and it says how many fit.
    "run too many level-1 tasks": (lambda t: ["run", train_cfg(t, **{"domain.difficulty": 1, "domain.n_train": 200})],
                                   2, "at most 100 tasks"),
    "report garbage folder": (lambda t: ["report", garbage(t)], 2, "meta.json"),
    "backtest on garbage folder": (lambda t: ["backtest", REFERENCE, "--on", garbage(t)], 2, "meta.json"),
    "genome check num_generations 1": (lambda t: ["genome", "check", genome_with(
        t, '"num_generations": {"value": 4, "choices": [2, 4, 8]}', '"num_generations": {"value": 1, "choices": [1, 2, 4, 8]}')],
        1, "num_generations"),
    "genome check loss_type magic": (lambda t: ["genome", "check", genome_with(
        t, '"loss_type": {"value": "dapo", "choices": ["grpo", "dr_grpo", "dapo", "bnpo"]}',
        '"loss_type": {"value": "magic", "choices": ["magic", "dapo"]}')],
        1, "loss_type"),
    "genome run negative timeout": (lambda t: ["genome", "run", REFERENCE, "--hook", "reward", "--timeout", "-5"],
                                    2, "timeout"),
    "status zero events": (lambda t: ["status", t, "--events", "0"], 2, "events"),
    "train a directory as config": (lambda t: ["train", t], 2, "is a directory; name a YAML file"),
    "train a directory as harness": (lambda t: ["train", train_cfg(t, harness=str(t))], 2, "is a directory"),
    "train a relative harness that is not there": (lambda t: ["train", train_cfg(t, harness="h/none.py")], 2,
                                                   "a relative path is read from the working directory"),
    "run a negative operator weight": (lambda t: ["run", train_cfg(t, **{"evolution.operators": {"knobs": -1.0}})],
                                       2, "negative weight for 'knobs'"),
    "run an unknown episode field": (lambda t: ["run", train_cfg(t, **{"domain.name": "swe", "domain.difficulty": 1,
                                                                        "domain.episode": {"bogus": 1}})],
                                     2, "allowed here: max_turns"),
    "status state of wrong types": (lambda t: ["status", retyped(t, generation="x")], 2, "generation is str"),
    "resume state of wrong types": (lambda t: ["resume", retyped(t, live="v0001", status="running")], 2,
                                    "live is str"),
    "train a binary config": (lambda t: ["train", binary(t, "cfg.yaml")], 2, "not a UTF-8 text file"),
    "train a binary harness": (lambda t: ["train", train_cfg(t, harness=str(binary(t, "h.py")))], 2,
                               "not a UTF-8 text file"),
    "genome run binary rollouts": (lambda t: ["genome", "run", REFERENCE, "--hook", "reward", "--rollouts",
                                              binary(t, "r.jsonl")], 1, "r.jsonl:1: not UTF-8"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_failure_is_a_short_message_not_a_traceback(name, tmp_path):
    build, code, needle = CASES[name]
    args = build(tmp_path)
    done = cli(args, tmp_path)
    out = done.stdout + done.stderr
    assert "Traceback" not in out, out[-3000:]
    assert done.returncode == code, (done.returncode, out[-2000:])
    assert needle in out, out[-2000:]
    # One or two lines: the message, and for an unexpected failure the pointer to --debug.
    # (genome check answers on stdout; argparse puts the usage before its one error line)
    lines = [line for line in (done.stderr.strip() or done.stdout.strip()).splitlines()
             if not line.startswith(("usage:", " "))]
    assert 1 <= len(lines) <= 2 and ("error: " in lines[0] or lines[0].startswith(str(args[-1]))), lines
    if name == "run unknown operator":   # refused before any compute: no run directory at all
        assert not (tmp_path / "out").exists()


def test_debug_shows_the_traceback(tmp_path):
    done = cli(["--debug", "status", tmp_path / "nope"], tmp_path)
    assert "Traceback" in done.stderr and done.returncode == 1
    done = cli(["status", tmp_path / "nope"], tmp_path, env={"EVOTRAINER_DEBUG": "1"})
    assert "Traceback" in done.stderr


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    """`evotrainer ... | head`: the pipe closes before we write; no traceback, no 'Exception ignored'."""
    r, w = os.pipe()
    os.close(r)   # the reader is gone before the command writes its first line
    try:
        done = cli(["genome", "check", REFERENCE], tmp_path, stdout=w)
    finally:
        os.close(w)
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert done.returncode == 1


def test_genome_check_accepts_what_train_accepts(tmp_path):
    done = cli(["genome", "check", REFERENCE], tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("ok ")


def test_verbose_shows_evotrainer_info_messages(capsys):
    import logging

    from evotrainer.cli.app import main

    log = logging.getLogger("evotrainer")
    before = list(log.handlers)
    try:
        assert main(["-v", "genome", "check", str(REFERENCE)]) == 0
        logging.getLogger("evotrainer.operators.library").info("library: left out an entry")
        assert "evotrainer.operators.library: library: left out an entry" in capsys.readouterr().err
    finally:
        log.handlers[:] = before
        log.setLevel(logging.NOTSET)
    logging.getLogger("evotrainer.operators.library").info("not shown")
    assert "not shown" not in capsys.readouterr().err   # without -v, info stays in the log
