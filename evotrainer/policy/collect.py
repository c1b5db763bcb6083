"""Collecting rollouts: sample groups for tasks with a rollout engine and verify them.

The verdict of the domain's verifier goes to ``visible`` for train tasks (training may see it) and
to ``hidden`` for held-out and test tasks: a harness never sees held-out verification. An episodic
domain (one with a tool environment: SWE) gets multi-turn episodes (``policy/episodes.py``) through
the same two calls, graded on the patch each episode submitted; several versions' episodes go in
lockstep on an engine with ``generate_ids_many`` (docs/concepts/limits.md says how far their tokens
equal each version's alone).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Protocol, Sequence

from evotrainer.domains.base import Domain
from evotrainer.domains.task import Task
from evotrainer.policy.episodes import episode_rollouts, episode_rollouts_many, is_episodic
from evotrainer.policy.rollout_engine import Completion, RolloutEngine, SamplingParams
from evotrainer.records.rollout import Rollout

SYSTEM_PROMPT = None  # the domain's prompt carries the instruction; keep the model's own system prompt
Messages = list[dict[str, str]]
PromptFn = Callable[[Task], Messages]


class PromptHook(Protocol):
    def prompt(self, task: Task) -> Messages: ...
    def uses_reference(self, hook: str) -> bool: ...


def default_prompt(task: Task) -> Messages:
    return task.messages(SYSTEM_PROMPT)


def prompt_fn(harness: PromptHook | None) -> PromptFn:
    """How a harness asks its tasks: its ``prompt`` hook, or the task's own prompt when the hook is
    the reference's (the same messages, without a sandbox round trip per task)."""
    if harness is None or harness.uses_reference("prompt"):
        return default_prompt
    return harness.prompt


def collect_groups(engine: RolloutEngine, domain: Domain, tasks: Sequence[Task], group_size: int,
                   params: SamplingParams, adapter: str | None, step: int = 0,
                   prompt: PromptFn = default_prompt) -> list[Rollout]:
    """``group_size`` rollouts per task (one GRPO group each), verified by ``domain``. ``prompt`` turns
    a task into chat messages (a harness's ``prompt`` hook); the engine checks what it produced."""
    if is_episodic(domain):
        rollouts, verdicts = episode_rollouts(engine, domain, tasks, group_size, params, adapter, step,
                                              None if prompt is default_prompt else prompt)
    else:
        rollouts, verdicts = _single_turn(engine, domain, tasks, group_size, params, adapter, step, prompt)
    _file_verdicts(rollouts, verdicts)
    return rollouts


def _file_verdicts(rollouts: Sequence[Rollout], verdicts: Sequence[dict]) -> None:
    for r, verdict in zip(rollouts, verdicts):
        r.visible, r.hidden = (verdict, {}) if r.split == "train" else (
            {"format_ok": verdict.get("format_ok", False)}, verdict)


def _single_turn(engine: RolloutEngine, domain: Domain, tasks: Sequence[Task], group_size: int,
                 params: SamplingParams, adapter: str | None, step: int,
                 prompt: PromptFn) -> tuple[list[Rollout], list[dict]]:
    asked = {id(t): prompt(t) for t in tasks}
    prompts = [asked[id(t)] for t in tasks for _ in range(group_size)]
    completions = engine.generate(prompts, params, adapter=adapter)
    expanded = [t for t in tasks for _ in range(group_size)]
    return _rollouts(expanded, prompts, completions, group_size, params, step), domain.verify_batch(
        expanded, [c.text for c in completions])


def _rollouts(tasks: Sequence[Task], prompts: Sequence[Messages], completions: Sequence[Completion],
              group_size: int, params: SamplingParams, step: int) -> list[Rollout]:
    return [Rollout(
        task_id=task.id, messages=prompts[i], completion=c.text, prompt_ids=c.prompt_ids,
        completion_ids=c.completion_ids, logprobs=c.logprobs, truncated=c.truncated,
        stop_reason=c.stop_reason, gen_seconds=c.gen_seconds, seed=params.seed, group=i // group_size,
        step=step, split=task.split,
    ) for i, (task, c) in enumerate(zip(tasks, completions))]


def verify(engine: RolloutEngine, domain: Domain, tasks: Sequence[Task], adapter: str | None,
           max_new_tokens: int, temperature: float = 0.0, seeds: Sequence[int] = (0,),
           prompt: PromptFn = default_prompt) -> list[Rollout]:
    """Held-out verification: one rollout per task and seed, hidden outcome filled by the engine.
    A version is verified as it is asked in training (its harness's ``prompt``)."""
    if prompt is not default_prompt:   # ask once per task, not once per seed
        asked = {t.id: prompt(t) for t in tasks}
        prompt = lambda t: asked[t.id]   # noqa: E731
    out: list[Rollout] = []
    for seed in seeds:
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
        out.extend(collect_groups(engine, domain, tasks, 1, params, adapter, step=-1, prompt=prompt))
    return out


VerifyJob = tuple[Sequence[Task], "str | None", PromptFn]   # (tasks, adapter, how they are asked)


class CollectJob(NamedTuple):
    """One branch's request for one step's training rollouts (:func:`collect_many`)."""
    tasks: Sequence[Task]
    group_size: int           # completions per task
    params: SamplingParams
    adapter: str | None       # the branch's adapter (None: the base model)
    prompt: PromptFn          # how the branch's harness asks each task
    step: int


def shares_batches(engine: RolloutEngine, domain: Domain, versions: int) -> bool:
    """Whether :func:`verify_many` and :func:`collect_many` put ``versions`` versions' prompts (an
    episodic domain: each turn of their episodes) in one engine call."""
    return versions > 1 and hasattr(engine, "generate_ids_many" if is_episodic(domain) else "generate_many")


def _asked_once(prompt: PromptFn) -> PromptFn:
    """``prompt``, asked once per task whatever the seeds (a harness's hook runs in its sandbox)."""
    asked: dict[str, Messages] = {}

    def ask(task: Task) -> Messages:
        if task.id not in asked:
            asked[task.id] = prompt(task)
        return asked[task.id]
    return ask


def _episode_jobs(engine: RolloutEngine, domain: Domain, requests: list) -> list[list[Rollout]]:
    """Several branches' episodes in lockstep (``episodes.episode_rollouts_many``), their verdicts filed."""
    out = []
    for rollouts, verdicts in episode_rollouts_many(engine, domain, requests):
        _file_verdicts(rollouts, verdicts)
        out.append(rollouts)
    return out


def collect_many(engine: RolloutEngine, domain: Domain, jobs: Sequence[CollectJob]) -> list[list[Rollout]]:
    """:func:`collect_groups` for several branches, one job each, in one ``generate_many`` call when
    the engine serves several adapters at once (vLLM, the transformers engine); otherwise one branch
    after another. Each job keeps its own sampling settings and seed."""
    if not shares_batches(engine, domain, len(jobs)):
        return [collect_groups(engine, domain, j.tasks, j.group_size, j.params, j.adapter, step=j.step,
                               prompt=j.prompt)
                for j in jobs]
    if is_episodic(domain):
        return _episode_jobs(engine, domain, [(j.tasks, j.group_size, j.params, j.adapter, j.step,
                                               None if j.prompt is default_prompt else j.prompt) for j in jobs])
    expanded = [[t for t in j.tasks for _ in range(j.group_size)] for j in jobs]
    asked = []
    for j, exp in zip(jobs, expanded):
        once = {id(t): j.prompt(t) for t in j.tasks}
        asked.append([once[id(t)] for t in exp])
    done = engine.generate_many([(prompts, j.params, j.adapter) for prompts, j in zip(asked, jobs)])
    out = []
    for j, tasks, prompts, completions in zip(jobs, expanded, asked, done):
        rollouts = _rollouts(tasks, prompts, completions, j.group_size, j.params, j.step)
        _file_verdicts(rollouts, domain.verify_batch(tasks, [c.text for c in completions]))
        out.append(rollouts)
    return out


def verify_many(engine: RolloutEngine, domain: Domain, jobs: Sequence[VerifyJob], max_new_tokens: int,
                temperature: float = 0.0, seeds: Sequence[int] = (0,)) -> list[list[Rollout]]:
    """:func:`verify` for several versions, one job each. An engine that serves several adapters in
    one call (``generate_many``: vLLM, the transformers engine) gets every version's prompts in one call per seed, so the
    population shares batches (an episodic domain: each turn of every version's episodes, on an engine
    with ``generate_ids_many``); otherwise one version after another."""
    if not shares_batches(engine, domain, len(jobs)):
        return [verify(engine, domain, tasks, adapter, max_new_tokens, temperature, seeds, prompt)
                for tasks, adapter, prompt in jobs]
    if is_episodic(domain):
        asks = [None if prompt is default_prompt else _asked_once(prompt) for _, _, prompt in jobs]
        out: list[list[Rollout]] = [[] for _ in jobs]
        for seed in seeds:
            params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
            done = _episode_jobs(engine, domain, [(tasks, 1, params, adapter, -1, ask)
                                                  for (tasks, adapter, _), ask in zip(jobs, asks)])
            for rollouts_of, rollouts in zip(out, done):
                rollouts_of.extend(rollouts)
        return out
    asked = [[prompt(t) for t in tasks] for tasks, _, prompt in jobs]   # once per task, not per seed
    out: list[list[Rollout]] = [[] for _ in jobs]
    for seed in seeds:
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
        done = engine.generate_many([(prompts, params, adapter) for prompts, (_, adapter, _) in zip(asked, jobs)])
        for rollouts_of, (tasks, _, _), prompts, completions in zip(out, jobs, asked, done):
            rollouts = _rollouts(tasks, prompts, completions, 1, params, step=-1)
            _file_verdicts(rollouts, domain.verify_batch(tasks, [c.text for c in completions]))
            rollouts_of.extend(rollouts)
    return out
