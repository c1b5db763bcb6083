"""Merge children (policy/adapter_merge.py, loop/stages/merging.py): two adapters merged with peft's
add_weighted_adapter on the tiny model, checked tensor by tensor against the combination's formula;
incompatible adapters refused by name; and a merge child of two survivors in a tiny run, with both
parents in meta.json and MLflow, trained and gated against its control."""

import json
import math
import shutil

import pytest
import torch
from peft.utils.merge_utils import ties

from evotrainer.config import parse_config
from evotrainer.genome.edits import crossover
from evotrainer.genome.program import HarnessProgram
from evotrainer.loop.experiment import Experiment
from evotrainer.loop.stages.merging import START_ADAPTER, merge_pair, propose_merge, start_adapter
from evotrainer.policy.adapter_merge import AdapterMergeError, lora_tensors, merge_adapters
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.records.history import proposal_of

from tests.loop_runs import mlflow_runs, tiny_cfg

R, ALPHA = 4, 8
S = ALPHA / R          # the branches' LoRA scaling


@pytest.fixture(scope="module")
def adapters(tiny, tmp_path_factory):
    """A policy on the tiny model with a branch of its own, and two saved adapters with random A and B."""
    model, tok = tiny
    policy = Policy(model, tok, LoraSettings(r=R, lora_alpha=ALPHA))
    root = tmp_path_factory.mktemp("adapters")
    gen = torch.Generator().manual_seed(0)
    for name in ("own", "first", "second"):   # (peft warns of a name inside "lora_", such as "a")
        policy.create(name)
        with torch.no_grad():
            for pname, p in policy.model.named_parameters():
                if f".{name}." in pname and "lora_" in pname:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    for name, folder in (("first", "a"), ("second", "b")):
        policy.save(name, root / folder)
        policy.remove(name)
    policy.model.set_adapter("own")
    return policy, root


def pairs(tensors):
    """module prefix -> (lora_A, lora_B)."""
    return {k[: -len(".lora_A.weight")]: (tensors[k], tensors[k.replace("lora_A", "lora_B")])
            for k in tensors if k.endswith("lora_A.weight")}


def test_linear_merge_is_peft_task_arithmetic_on_a_and_b_in_the_branches_config(adapters, tmp_path):
    policy, root = adapters
    own_before = {k: v.clone() for k, v in policy.model.state_dict().items() if ".own." in k}
    out = merge_adapters(policy, root / "a", root / "b", tmp_path / "m", combination="linear", weights=(0.5, 0.5))
    # The merged adapter is an ordinary branch adapter: the first one's config (rank, alpha, modules).
    assert json.loads((out / "adapter_config.json").read_text()) == json.loads((root / "a" / "adapter_config.json").read_text())
    ta, tb, tm = pairs(lora_tensors(root / "a")), pairs(lora_tensors(root / "b")), pairs(lora_tensors(out))
    assert tm.keys() == ta.keys() and len(tm) == 4 * 2   # q, k, v, o of the tiny model's two layers
    for key, (am, bm) in tm.items():
        (aa, ba), (ab, bb) = ta[key], tb[key]
        # peft's linear: A and B each summed with sqrt(weight * scaling), merged scaling 1
        expected = (math.sqrt(0.5 * S) * (bb + ba)) @ (math.sqrt(0.5 * S) * (ab + aa))
        assert torch.allclose(S * bm @ am, expected, atol=1e-5), key
        assert not torch.allclose(S * bm @ am, S * ba @ aa, atol=1e-3)   # it really is another update
    # The policy's own branches are untouched, and none of the merge's adapters is left in it.
    assert policy.branches == ["own"] and set(policy.model.peft_config) == {"own"}
    assert policy.model.active_adapter == "own"
    assert all(torch.equal(v, policy.model.state_dict()[k]) for k, v in own_before.items())


def test_a_linear_merge_weighted_one_and_zero_is_the_first_adapter(adapters, tmp_path):
    policy, root = adapters
    out = merge_adapters(policy, root / "a", root / "b", tmp_path / "m", combination="linear", weights=(1.0, 0.0))
    ta, tm = lora_tensors(root / "a"), lora_tensors(out)
    assert all(torch.allclose(tm[k], ta[k], atol=1e-6) for k in ta)


def test_ties_merge_trims_elects_signs_and_averages_per_factor(adapters, tmp_path):
    policy, root = adapters
    out = merge_adapters(policy, root / "a", root / "b", tmp_path / "m", combination="ties", weights=(0.7, 0.3),
                         density=0.5)
    ta, tb, tm = lora_tensors(root / "a"), lora_tensors(root / "b"), lora_tensors(out)
    w = torch.tensor([math.sqrt(0.7 * S), math.sqrt(0.3 * S)])
    for key in tm:
        expected = ties([ta[key], tb[key]], w, 0.5, "total") / math.sqrt(S)   # back into the branch's scaling
        assert torch.allclose(tm[key], expected, atol=1e-6), key
        assert (tm[key] == 0).float().mean() > 0.2   # trimmed: about half of each input is dropped


def test_dare_is_seeded(adapters, tmp_path):
    policy, root = adapters
    merged = [lora_tensors(merge_adapters(policy, root / "a", root / "b", tmp_path / f"m{i}", combination="dare_ties",
                                          density=0.5, seed=seed)) for i, seed in enumerate((1, 1, 2))]
    assert all(torch.equal(merged[0][k], merged[1][k]) for k in merged[0])
    assert any(not torch.equal(merged[0][k], merged[2][k]) for k in merged[0])


def _variant(root, tmp_path, **change):
    out = tmp_path / "variant"
    shutil.copytree(root / "b", out)
    config = json.loads((out / "adapter_config.json").read_text())
    config.update(change)
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("change, named", [({"r": 8}, "r 4 vs 8"),
                                           ({"target_modules": ["q_proj", "v_proj"]}, "target modules"),
                                           ({"base_model_name_or_path": "other/model"}, "base model")])
def test_incompatible_adapters_are_refused_naming_what_differs(adapters, tmp_path, change, named):
    policy, root = adapters
    with pytest.raises(AdapterMergeError, match=named) as err:
        merge_adapters(policy, root / "a", _variant(root, tmp_path, **change), tmp_path / "m")
    assert "cannot be merged" in str(err.value) and "same lora settings" in str(err.value)
    assert not (tmp_path / "m").exists() and policy.branches == ["own"]


def test_bad_settings_and_missing_adapters_are_refused(adapters, tmp_path):
    policy, root = adapters
    with pytest.raises(AdapterMergeError, match="'cat' is refused"):
        merge_adapters(policy, root / "a", root / "b", tmp_path / "m", combination="cat")
    with pytest.raises(AdapterMergeError, match="needs a density"):
        merge_adapters(policy, root / "a", root / "b", tmp_path / "m", combination="ties", density=None)
    with pytest.raises(AdapterMergeError, match="adapter_config.json missing"):
        merge_adapters(policy, root / "a", tmp_path, tmp_path / "m")


def _gated_pair(tmp_path, **merge):
    """A tiny run of two generations whose second leaves two survivors (the seed's continuation and a
    kept knob child), then made ready for a third generation."""
    run_dir = tmp_path / "run"
    exp = Experiment(parse_config(tiny_cfg(run_dir, generations=2, children_per_generation=1,
                                           operators={"knobs": 1.0}, merge=merge or None)))
    exp.run()
    survivors = exp.state.survivors
    assert len(survivors) == 2, exp.state.events[-10:]
    exp.cfg.evolution.generations = 3
    exp.state.status = "running"
    exp.continue_survivors(2)
    return exp, run_dir


@pytest.fixture(scope="module")
def merged_run(tmp_path_factory):
    """The tiny run's third generation with a linear merge child of its two survivors, run to the end:
    (experiment, child id, its parents, what propose_merge left before training, run directory)."""
    exp, run_dir = _gated_pair(tmp_path_factory.mktemp("merged"), combination="linear")
    a, b = merge_pair(exp, exp.state.survivors)
    cid = propose_merge(exp, a, b, 2)
    assert cid is not None and cid in exp.state.live
    before = {"meta": exp.vdir(cid).meta(), "adapter": lora_tensors(exp.vdir(cid).adapter_dir),
              "optimizer": (exp.vdir(cid).adapter_dir / "optimizer.pt").exists(),
              "next_pair": merge_pair(exp, exp.state.survivors)}
    exp.save()
    state = exp.run()
    assert state.status == "finished"
    yield exp, cid, (a, b), before, run_dir
    exp.close()


def test_a_merge_child_has_both_parents_and_starts_from_the_merge(merged_run):
    exp, cid, (a, b), before, _ = merged_run
    child = before["meta"]
    assert child.parents == [a, b] and child.operator == "merge" and child.status == "pending"
    assert child.intervention["details"]["merge"]["parents"] == [a, b]
    # The harness: the first parent's with one factor of the second's (or its own when they do not differ).
    pa, pb = (HarnessProgram(exp.vdir(v).genome_source()) for v in (a, b))
    took = child.intervention["details"].get("took")
    assert child.genome_hash == (crossover(pa, pb, took).hash if took else pa.hash)
    assert child.intervention["factors"] == ([took] if took else []) + ["adapter:merge"]
    assert json.loads((exp.vdir(cid).path / "meta.json").read_text())["parents"] == [a, b]
    # Its start adapter is the linear merge of both parents' trained adapters, and its adapter folder held it.
    start = lora_tensors(exp.vdir(cid).path / START_ADAPTER)
    ta, tb = pairs(lora_tensors(exp.vdir(a).adapter_dir)), pairs(lora_tensors(exp.vdir(b).adapter_dir))
    s = exp.cfg.lora.lora_alpha / exp.cfg.lora.r
    for key, (am, bm) in pairs(start).items():
        (aa, ba), (ab, bb) = ta[key], tb[key]
        expected = (math.sqrt(0.5 * s) * (bb + ba)) @ (math.sqrt(0.5 * s) * (ab + aa))
        assert torch.allclose(s * bm @ am, expected, atol=1e-5), key
    assert all(torch.equal(start[k], before["adapter"][k]) for k in start)
    assert not before["optimizer"]          # the first parent's AdamW moments fit its own adapter, not this one
    assert before["next_pair"] != (a, b)    # the same pair is not merged twice


def test_a_merge_child_is_trained_gated_against_its_control_and_recorded(merged_run):
    exp, cid, (a, b), _, run_dir = merged_run
    child = exp.vdir(cid).meta()
    control = next(v for v in exp.generation_versions(2) if exp.vdir(v).meta().operator is None
                   and exp.vdir(v).meta().parents == [a])
    # Trained k steps and gated against the first parent's continuation like any child.
    assert len(exp.vdir(cid).steps()) == exp.cfg.evolution.steps_per_generation
    assert child.status in ("promoted", "kept", "rejected", "invalid", "pruned")
    assert child.decision and child.decision["spend"]["control"] is not None
    assert child.decision["spend"]["control"]["train_steps"] == len(exp.vdir(control).steps())
    assert any(f"{cid} vs {control}" in e for e in exp.state.events)
    assert proposal_of(exp.state.history, cid).merge == [a, b]
    runs = {r.data.tags["evotrainer.version_id"]: r for r in mlflow_runs(run_dir)}
    tags = runs[cid].data.tags
    assert tags["evotrainer.parents"] == f"{a},{b}" and tags["evotrainer.operator"] == "merge"
    assert tags["mlflow.parentRunId"] == runs[a].info.run_id   # nested under the first parent's run
    assert (run_dir / "plots").is_dir()


def test_a_lost_start_adapter_is_merged_again_bit_for_bit(merged_run):
    """A crash between the child's creation and its merge: the merge is a function of the parents'
    adapters and the recorded settings (DARE's seed too), so it is made again, the same."""
    exp, cid, _, _, _ = merged_run
    path = exp.vdir(cid).path / START_ADAPTER
    saved = lora_tensors(path)
    shutil.rmtree(path)
    assert start_adapter(exp, exp.vdir(cid).meta()) == path
    rebuilt = lora_tensors(path)
    assert saved.keys() == rebuilt.keys() and all(torch.equal(saved[k], rebuilt[k]) for k in saved)
    assert start_adapter(exp, exp.vdir(merged_run[2][0]).meta()) is None   # the first parent: not a merge child


def test_the_merge_child_trains_from_the_merged_adapter(merged_run):
    exp, cid, (a, _), _, _ = merged_run
    trained = lora_tensors(exp.vdir(cid).adapter_dir)
    start, first = lora_tensors(exp.vdir(cid).path / START_ADAPTER), lora_tensors(exp.vdir(a).adapter_dir)

    def dist(x, y):
        return sum(float((x[k] - y[k]).norm()) for k in x)

    # k small steps move the adapter far less than the merge moved it away from the first parent's
    assert dist(trained, start) < dist(start, first) / 10 < dist(trained, first)


def test_a_merge_that_cannot_be_made_is_logged_and_recorded(tmp_path):
    exp, _ = _gated_pair(tmp_path)
    a, b = exp.state.survivors
    config = exp.vdir(b).adapter_dir / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "r": 2}))
    live = list(exp.state.live)
    assert propose_merge(exp, a, b, 2) is None
    assert exp.state.live == live
    assert exp.state.history[-1].outcome == "merge_refused" and "r 16 vs 2" in exp.state.history[-1].reason
    assert any(f"no merge child of {a} and {b}" in e for e in exp.state.events)
    exp.close()
