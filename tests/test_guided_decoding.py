"""Guided tool calls (policy/guided_decoding.py, the SWE call grammar, the guided_call_share knob):
a random model decodes well-formed calls under the grammar on both decoders, records the unguided
log-probability the trainer recomputes, leaves free rows untouched, and training episodes split
into guided and free members while held-out episodes stay free."""

import contextlib
import json

import pytest
import torch

from evotrainer.domains.swe.environment import call_grammar, parse_call, tool_prompt
from evotrainer.policy.base_model import load_base_model
from evotrainer.policy.episodes import guided_members
from evotrainer.policy.grpo_config import GRPOConfig
from evotrainer.policy.guided_decoding import GuidedRows, compile_grammar
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.rollout_engine import SamplingParams, TransformersEngine

FILES = ["pkg/__init__.py", "pkg/mod.py", "tests/test_mod.py"]
ASK = [{"role": "system", "content": tool_prompt()}, {"role": "user", "content": "Fix the bug in pkg/mod.py."}]


@pytest.fixture(scope="module")
def policy():
    model, tok = load_base_model("tiny-random", seed=0, initializer_range=0.5)
    pol = Policy(model, tok, LoraSettings(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    pol.create("br")
    with torch.no_grad():   # a trained-looking adapter (a fresh one equals the base model)
        torch.manual_seed(1)
        for p in pol.parameters("br"):
            p.add_(torch.randn_like(p) * 0.3)
    return pol


def _hf_logps(policy, prompt, ids, temperature):
    """log p of each of ``ids`` after ``prompt`` under the adapter, as the trainer computes it."""
    x = torch.tensor([prompt + ids])
    with torch.no_grad(), policy.adapter("br") as m:
        logits = m(input_ids=x).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None]).squeeze(1)


@pytest.mark.parametrize("decoder", ["kv", "generate"])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_guided_rows_decode_calls_the_environment_accepts_and_free_rows_do_not(policy, decoder, temperature):
    engine = TransformersEngine(policy, decoder=decoder)
    grammar = call_grammar(FILES)
    params = SamplingParams(temperature=temperature, max_new_tokens=200, seed=3)
    out = engine.generate_ids(engine.encode([ASK] * 4), params, "br", grammars=[grammar, None, grammar, grammar])
    for i in (0, 2, 3):
        name, args = parse_call(out[i].text)          # raises ToolError on a malformed call
        assert out[i].stop_reason == "eos"
        for key in ("path", "tests"):
            value = args.get(key)
            assert value is None or set([value] if isinstance(value, str) else value) <= set(FILES)
    with pytest.raises(Exception, match="tool"):       # a random model's own text is no call
        parse_call(out[1].text)


def test_a_guided_row_leaves_the_free_rows_of_its_batch_as_they_were(policy):
    engine = TransformersEngine(policy, decoder="kv")
    params = SamplingParams(temperature=1.0, max_new_tokens=40, seed=5)
    free = engine.generate_ids(engine.encode([ASK] * 3), params, "br")
    mixed = engine.generate_ids(engine.encode([ASK] * 3), params, "br", grammars=[None, call_grammar(FILES), None])
    assert [c.completion_ids for c in (free[0], free[2])] == [c.completion_ids for c in (mixed[0], mixed[2])]
    assert mixed[1].completion_ids != free[1].completion_ids


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_guided_token_records_the_policys_unguided_logprob(policy, temperature):
    """The importance ratio against the trainer's recomputation is 1 on the first pass: the sampler
    records log p under the unmasked distribution, not the renormalised masked one."""
    engine = TransformersEngine(policy, decoder="kv")
    prompt = engine.encode([ASK])[0]
    (c,) = engine.generate_ids([prompt], SamplingParams(temperature=temperature, max_new_tokens=60, seed=2), "br",
                               grammars=[call_grammar(FILES)])
    want = _hf_logps(policy, prompt, c.completion_ids, temperature)
    assert torch.allclose(torch.tensor(c.logprobs), want, atol=2e-3)
    # and the mask mattered: some forced token is one the free policy would rarely draw
    assert min(c.logprobs) < -3.0


def test_a_grammar_llguidance_cannot_read_is_a_clear_error(policy):
    with pytest.raises(ValueError, match="not valid llguidance Lark"):
        compile_grammar('start: "a" undefined_rule')
    with pytest.raises(ValueError, match="one per sequence"):
        TransformersEngine(policy).generate_ids([[1, 2]], SamplingParams(), grammars=["start: \"a\"", None])


def test_the_mask_allows_only_what_the_grammar_allows_next(policy):
    tok = policy.tokenizer
    vocab = policy.base_model.get_output_embeddings().weight.shape[0]
    rows = GuidedRows(tok, [call_grammar(FILES), None], vocab)
    masked = rows.mask_(torch.zeros(2, vocab), [0, 1])
    allowed = torch.isfinite(masked[0]).nonzero().squeeze(1).tolist()
    assert allowed and all("```tool".startswith(tok.decode([t])) for t in allowed)
    assert torch.isfinite(masked[1]).all()          # a free row is untouched


def test_guided_members_split_each_group_and_refuse_a_share_outside_0_1():
    assert guided_members(2, 4, 0.5) == ["call", "call", None, None] * 2
    assert guided_members(1, 4, 0.0) == [None] * 4
    assert guided_members(1, 4, 0.25) == ["call", None, None, None]
    assert guided_members(1, 4, 0.25, plan_share=0.5) == ["plan", "plan", "call", None]
    assert guided_members(1, 2, 0.0, plan_share=0.5) == ["plan", None]
    assert guided_members(1, 4, 1.0, plan_share=0.5) == ["plan", "plan", "call", "call"]   # plan first, then what is left
    # A share above 0 guides someone: 0.25 of 2 would round to no member, a child that is its parent.
    assert guided_members(1, 2, 0.25) == ["call", None] and guided_members(1, 2, 0.0, plan_share=0.25) == ["plan", None]
    assert guided_members(1, 2, 0.25, plan_share=0.5) == ["plan", "call"]
    with pytest.raises(ValueError, match="guided_call_share must be within"):
        guided_members(1, 4, 1.5)
    with pytest.raises(ValueError, match="guided_plan_share must be within"):
        guided_members(1, 4, 0.0, plan_share=-0.1)


SOURCES = {"pkg/__init__.py": "", "pkg/mod.py": "def f(x):\n    return x\n\ndef g(x):\n    return x + 1\n",
           "tests/test_mod.py": "from pkg.mod import f\n\ndef test_f():\n    assert f(1) == 2\n"}


def test_unique_lines_are_those_an_edit_can_name_once():
    from evotrainer.domains.swe.environment import unique_lines

    # "    return x" is inside "    return x + 1": an edit naming it would be refused (found twice)
    assert unique_lines(SOURCES["pkg/mod.py"]) == ["def f(x):", "def g(x):", "    return x + 1"]
    assert unique_lines("") == [] and unique_lines("a\na\n") == []


def _accepts(policy, grammar: str, text: str) -> bool:
    """Whether ``grammar`` accepts ``text`` whole, fed token by token as a guided row consumes a sample."""
    vocab = policy.base_model.get_output_embeddings().weight.shape[0]
    rows = GuidedRows(policy.tokenizer, [grammar], vocab)
    try:
        for t in policy.tokenizer(text, add_special_tokens=False)["input_ids"]:
            rows.consume(0, t)
    except RuntimeError:
        return False
    return rows.complete(0)


def _call(name: str, **args) -> str:
    import json
    return "```tool\n" + json.dumps({"name": name, "args": args}) + "\n```"


def test_with_the_files_texts_a_guided_edit_names_a_line_its_file_holds_once(policy):
    """An edit the grammar allows is one the environment applies: a source file (never a test), one of
    its unique lines as the search text, a one-line replacement. ``tool`` fixes the tool (a plan turn)."""
    from evotrainer.domains.swe.environment import SWEEnvironment

    good = _call("edit", path="pkg/mod.py", search="    return x + 1", replace="    return x - 1")
    assert _accepts(policy, call_grammar(SOURCES), good) and _accepts(policy, call_grammar(SOURCES, "edit"), good)
    result, record = SWEEnvironment(SOURCES).step(good)
    assert record["error"] is None and result == "edited pkg/mod.py"
    for bad in (_call("edit", path="pkg/mod.py", search="    return x", replace="y"),        # found twice
                _call("edit", path="pkg/mod.py", search="def nothing():", replace="y"),     # not in the file
                _call("edit", path="tests/test_mod.py", search="def test_f():", replace="y"),  # a test
                _call("edit", path="pkg/mod.py", search="def f(x):", replace="a\nb")):    # two lines
        assert not _accepts(policy, call_grammar(SOURCES), bad), bad
    assert _accepts(policy, call_grammar(sorted(SOURCES)), _call("edit", path="pkg/mod.py", search="x", replace="y"))
    read = _call("read_file", path="pkg/mod.py")
    assert _accepts(policy, call_grammar(SOURCES, "read_file"), read)
    assert not _accepts(policy, call_grammar(SOURCES, "edit"), read)
    assert not _accepts(policy, call_grammar(SOURCES, "read_file"), _call("read_file", path="pkg/mod.py", start=6))
    with pytest.raises(ValueError, match="no tool 'rm'"):
        call_grammar(SOURCES, "rm")


def test_a_token_edit_grammar_allows_only_one_token_changes_of_a_python_line(policy):
    """``edit="token"``: the replacement is one of the named line's variants (token_edits.py); a free
    replacement, a line with nothing to change and a file that is not Python are refused."""
    files = {**SOURCES, "README.md": "# pkg\nx + 1 tests\n"}
    grammar = call_grammar(files, "edit", edit="token")
    assert _accepts(policy, grammar, _call("edit", path="pkg/mod.py", search="    return x + 1", replace="    return x - 1"))
    assert _accepts(policy, grammar, _call("edit", path="pkg/mod.py", search="    return x + 1", replace="    return x + 2"))
    for bad in (_call("edit", path="pkg/mod.py", search="    return x + 1", replace="    ..."),      # free text
                _call("edit", path="pkg/mod.py", search="    return x + 1", replace="    return x + 1"),  # no change
                _call("edit", path="pkg/mod.py", search="def f(x):", replace="def f(y):"),          # nothing to change
                _call("edit", path="README.md", search="x + 1 tests", replace="x - 1 tests")):     # not Python
        assert not _accepts(policy, grammar, bad), bad
    assert _accepts(policy, call_grammar(files, "edit"), _call("edit", path="pkg/mod.py", search="def f(x):",
                                                               replace="    ..."))   # "line" (the default) allows it
    with pytest.raises(ValueError, match="edit must be one of"):
        call_grammar(files, "edit", edit="word")


def test_a_quoted_edit_grammar_names_only_the_line_the_issue_quotes(policy):
    """``edit="quoted"``: level 0's issue quotes the wrong line, and a guided edit may then name only
    that line (with one of its one-token variants); an issue that quotes no line of the file leaves
    every line with a variant, as ``token`` does. Real level-0 and level-1 tasks of the generator."""
    from evotrainer.domains import get_domain
    from evotrainer.domains.swe.token_edits import quoted_texts

    assert quoted_texts("The wrong line is line 3 of `a.py`: `    return x + 1`; expected `1`.") == {"return x + 1"}
    files = {**SOURCES, "pkg/other.py": "def h(y):\n    return y * 2\n"}
    issue = "`f` is wrong. The wrong line is line 2 of `pkg/mod.py`: `return x + 1`."
    quoted = call_grammar(files, "edit", edit="quoted", issue=issue)
    assert _accepts(policy, quoted, _call("edit", path="pkg/mod.py", search="    return x + 1", replace="    return x - 1"))
    assert not _accepts(policy, quoted, _call("edit", path="pkg/other.py", search="    return y * 2",
                                              replace="    return y + 2"))
    anywhere = call_grammar(files, "edit", edit="quoted", issue="`h` returns the wrong value")
    assert anywhere == call_grammar(files, "edit", edit="token")
    assert _accepts(policy, anywhere, _call("edit", path="pkg/other.py", search="    return y * 2", replace="    return y + 2"))

    domain = get_domain("swe", n_train=4, n_heldout=5, n_test=5, difficulty=[0, 1], seed=0)
    for task in domain.tasks("train"):
        env = domain.environment(task)
        bug = task.hidden["bug"]
        path = f"{task.visible['package']}/{bug['module']}.py"
        buggy = env.files[path].splitlines()[bug["line"] - 1]
        schema = json.loads(env.call_grammar("edit", "quoted").split("%json ", 1)[1])
        searches = {form["properties"]["args"]["properties"]["search"]["const"] for form in schema["oneOf"]}
        if task.difficulty == 0:
            assert searches == {buggy}, (task.id, searches)
        else:
            assert buggy in searches and len(searches) > 1, task.id


@pytest.mark.parametrize("decoder", ["kv", "generate"])
def test_a_plan_turn_decodes_the_tool_it_fixes(policy, decoder):
    engine = TransformersEngine(policy, decoder=decoder)
    for tool in ("read_file", "run_tests", "submit"):   # (an edit's free replacement is unbounded: above)
        outs = engine.generate_ids(engine.encode([ASK] * 2), SamplingParams(temperature=1.0, max_new_tokens=200,
                                                                          seed=7), "br",
                                   grammars=[call_grammar(SOURCES, tool)] * 2)
        assert [parse_call(c.text)[0] for c in outs] == [tool, tool], [c.text for c in outs]


@contextlib.contextmanager
def _swe_domain(tiny, limits, timeout_s: float):
    """A tiny-model engine over a fresh adapter, and a level-1 SWE domain (2 train issues) with ``limits``."""
    from evotrainer.domains.code.executor import ExecLimits
    from evotrainer.domains.swe.domain import SWEDomain

    model, tok = tiny
    pol = Policy(model, tok, LoraSettings(r=4, lora_alpha=8))
    pol.create("g0")
    domain = SWEDomain(n_train=2, n_heldout=1, n_test=1, difficulty=1, seed=0, workers=1,
                       limits=ExecLimits(timeout_s=timeout_s), episode_limits=limits)
    try:
        yield TransformersEngine(pol), domain
    finally:
        domain.close()


def test_training_episodes_split_into_guided_and_free_members_and_heldout_stays_free(tiny):
    from evotrainer.domains.swe.environment import EnvLimits
    from evotrainer.policy.collect import collect_groups, verify

    limits = EnvLimits(max_turns=2, max_turn_tokens=120, max_context_tokens=4000)
    with _swe_domain(tiny, limits, timeout_s=2.0) as (engine, domain):
        params = SamplingParams(max_new_tokens=120, seed=3, guided_call_share=0.5)
        rollouts = collect_groups(engine, domain, domain.tasks("train"), 2, params, "g0", step=0)
        assert [r.episode["guided"] for r in rollouts] == [True, False, True, False]
        assert [r.episode["guide"] for r in rollouts] == ["call", None, "call", None]
        for r in rollouts:
            cut = [t["tokens"] >= limits.max_turn_tokens for t in r.turn_log]
            parsed = [c.get("name") is not None for c in r.tool_calls]
            if r.episode["guided"]:   # every guided turn is a call the environment parsed, unless cut short
                assert all(p or c for p, c in zip(parsed, cut)), r.tool_calls
                assert any(parsed), r.turn_log
            else:                     # a random model's own turns are no calls
                assert not any(parsed)
        held = verify(engine, domain, domain.tasks("heldout"), "g0", max_new_tokens=120)
        assert all(not r.episode["guided"] for r in held)


def test_plan_episodes_read_edit_test_and_submit_in_turn(tiny):
    """A ``plan`` member's turns use read_file, edit, run_tests and submit in that order (a random
    policy's unbounded edit may be cut short); the free members of its group are left alone."""
    from evotrainer.domains.swe.environment import TOOL_PLAN, EnvLimits
    from evotrainer.policy.collect import collect_groups

    limits = EnvLimits(max_turns=4, max_turn_tokens=120, max_context_tokens=6000)
    with _swe_domain(tiny, limits, timeout_s=5.0) as (engine, domain):
        params = SamplingParams(max_new_tokens=120, seed=3, guided_plan_share=0.5)
        rollouts = collect_groups(engine, domain, domain.tasks("train"), 2, params, "g0", step=0)
        assert [r.episode["guide"] for r in rollouts] == ["plan", None, "plan", None]
        for r in rollouts:
            names = [c.get("name") for c in r.tool_calls]
            if r.episode["guide"] == "plan":
                cut = [t["tokens"] >= limits.max_turn_tokens for t in r.turn_log]
                assert all(n == want or c for n, want, c in zip(names, TOOL_PLAN, cut)), names
                assert names[2:] == ["run_tests", "submit"] and r.tool_calls[2]["error"] is None, r.tool_calls
                assert r.episode["stop_reason"] == "submitted"
            else:
                assert not any(names)


def test_plan_episodes_under_token_edits_change_one_token_and_keep_the_module_importable(tiny):
    """``guided_edit: token`` reaches the episodes: every guided edit writes a variant of the line it
    names, so its patch applies and the module still imports (no test errors on import)."""
    from evotrainer.domains.swe.environment import EnvLimits
    from evotrainer.domains.swe.token_edits import token_variants
    from evotrainer.policy.collect import collect_groups

    limits = EnvLimits(max_turns=4, max_turn_tokens=160, max_context_tokens=8000)
    with _swe_domain(tiny, limits, timeout_s=5.0) as (engine, domain):
        params = SamplingParams(max_new_tokens=160, seed=3, guided_plan_share=0.5, guided_edit="token")
        rollouts = collect_groups(engine, domain, domain.tasks("train"), 2, params, "g0", step=0)
        plans = [r for r in rollouts if r.episode["guide"] == "plan"]
        assert len(plans) == 2
        for r in plans:
            (edit,) = [c for c in r.tool_calls if c.get("name") == "edit"]
            assert edit["error"] is None and edit["args"]["replace"] in token_variants(edit["args"]["search"])
            assert r.visible["patch_applied"]
            task = next(t for t in domain.tasks("train") if t.id == r.task_id)
            source = task.visible["files"][edit["args"]["path"]]
            compile(source.replace(edit["args"]["search"], edit["args"]["replace"]), edit["args"]["path"], "exec")


def test_the_swe_library_answers_malformed_calls_with_guidance_and_the_report_reads_free_episodes():
    from evotrainer.genome.edits import factors_changed
    from evotrainer.genome.harness import Harness
    from evotrainer.genome.program import HarnessProgram
    from evotrainer.loop.seed import DOMAIN_HARNESSES
    from evotrainer.operators import get_operator
    from evotrainer.operators.base import Evidence
    from evotrainer.operators.library import default_entries, propose_entry

    swe = HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])
    report = {"metrics": {"turns_mean": 4.0, "malformed_call_rate": 1.0, "dead_group_ratio": 1.0}}
    found, skipped = get_operator("library").applicable(swe, Evidence(health_report=report))
    assert "swe_guided_tool_calls" in {a.entry.id for a in found}, skipped
    entry = {e.id: e for e in default_entries()}["swe_guided_tool_calls"]
    assert [c["value"] for c in entry.combinations(swe)] == [0.25, 0.5]
    iv = propose_entry("library", swe, entry, {"value": 0.5}, Evidence(health_report=report))
    child = HarnessProgram(iv.child_source)
    assert factors_changed(swe, child) == ["knob:guided_call_share"] and child.knobs["guided_call_share"]["value"] == 0.5
    # Guided episodes' calls are well-formed by construction: the call-form rates read the free ones.
    def ep(guided, ok):
        calls = [{"name": "list_files" if ok else None, "args": {}, "ok": ok}]
        return {"task_id": "t", "messages": [{"role": "user", "content": "issue"}], "completion": "", "turns": 1,
                "tool_calls": calls, "step": 0, "group": 0, "split": "train", "truncated": False,
                "visible": {"correct": False, "format_ok": True}, "episode": {"guided": guided}}
    rs = [ep(True, True), ep(False, False), ep(True, True), ep(False, False)]
    with Harness(swe) as h:
        m = h.metrics(rs, [rs])
    assert m["malformed_call_rate"] == 1.0 and m["guided_episode_rate"] == 0.5


def test_the_swe_library_answers_no_progress_with_the_tool_plan():
    from evotrainer.genome.edits import factors_changed
    from evotrainer.genome.program import HarnessProgram
    from evotrainer.loop.seed import DOMAIN_HARNESSES
    from evotrainer.operators import get_operator
    from evotrainer.operators.base import Evidence
    from evotrainer.operators.library import default_entries, propose_entry

    swe = HarnessProgram.from_file(DOMAIN_HARNESSES["swe"])
    op = get_operator("library")
    stuck = {"metrics": {"turns_mean": 4.0, "train_valid_call_rate": 0.94, "train_progress_rate": 0.0}}
    found, skipped = op.applicable(swe, Evidence(health_report=stuck))
    assert "swe_guided_tool_plan" in {a.entry.id for a in found}, skipped
    moving = {"metrics": {"turns_mean": 4.0, "train_valid_call_rate": 0.94, "train_progress_rate": 0.2}}
    assert "swe_guided_tool_plan" not in {a.entry.id for a in op.applicable(swe, Evidence(health_report=moving))[0]}
    entry = {e.id: e for e in default_entries()}["swe_guided_tool_plan"]
    assert [c["value"] for c in entry.combinations(swe)] == [0.25, 0.5]
    iv = propose_entry("library", swe, entry, {"value": 0.5}, Evidence(health_report=stuck))
    child = HarnessProgram(iv.child_source)
    assert factors_changed(swe, child) == ["knob:guided_plan_share"] and child.knobs["guided_plan_share"]["value"] == 0.5


def test_the_config_check_refuses_guidance_where_it_cannot_run():
    from evotrainer.config import parse_config
    from evotrainer.loop.tools.validate import config_problems

    math = parse_config({"model": "tiny-random", "grpo": {"guided_call_share": 0.5}})
    assert any("guided_call_share" in p and "swe" in p for p in config_problems(math, loop=False))
    swe = {"model": "tiny-random", "domain": {"name": "swe", "difficulty": 1}, "grpo": {"guided_call_share": 0.5}}
    assert not any("guided_call_share" in p for p in config_problems(parse_config(swe), loop=False))
    vllm = parse_config({**swe, "engine": "vllm"})
    assert any("engine: transformers" in p for p in config_problems(vllm, loop=False))
    plan = parse_config({"model": "tiny-random", "grpo": {"guided_plan_share": 0.5}})
    assert any("guided_plan_share" in p and "swe" in p for p in config_problems(plan, loop=False))
    plan_vllm = parse_config({**swe, "grpo": {"guided_plan_share": 0.5}, "engine": "vllm"})
    assert any("guided_plan_share" in p and "engine: transformers" in p for p in config_problems(plan_vllm, loop=False))
    token = parse_config({**swe, "grpo": {"guided_edit": "token"}})   # shapes guided edits, and none is guided
    assert any("guided_edit" in p and "guided_plan_share" in p for p in config_problems(token, loop=False))
    token = parse_config({**swe, "grpo": {"guided_edit": "token", "guided_plan_share": 0.5}})
    assert not any("guided_edit" in p for p in config_problems(token, loop=False))
    with pytest.raises(ValueError, match="guided_edit must be one of"):
        GRPOConfig(guided_edit="word")
