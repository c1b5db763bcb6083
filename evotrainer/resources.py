"""What an experiment holds across stages: model, engine, operators, records, budgets.

Heavy resources are created on first use, so ``evotrainer status`` or a resume that only has
bookkeeping left never loads a model.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time

from rich.console import Console
from rich.table import Table


class BudgetReached(Exception):
    pass


# budget_used["<key>_seconds"] as print_summary names them
TIME_LABELS = {"gen": "rollouts", "train": "gradient steps", "verify": "held-out verification", "propose": "proposals",
               "backtest": "backtests", "record": "MLflow", "health": "health reports", "gate": "gates",
               "adapter": "adapter load/save", "load": "model load", "finish": "lineage and plots"}


class Resources:
    """Mixin of :class:`~evotrainer.experiment.Experiment` (``cfg``, ``state``, ``run_dir`` set there)."""

    # ---- tasks and model ----------------------------------------------------------------------
    @functools.cached_property
    def domain(self):
        from evotrainer.train import build_domain

        return build_domain(self.cfg)

    @functools.cached_property
    def train_tasks(self):
        return self.domain.tasks("train")

    @functools.cached_property
    def heldout_tasks(self):
        return self.domain.tasks("heldout")[: self.cfg.train.eval_size]

    @functools.cached_property
    def policy(self):
        with self.timed("load"):
            from evotrainer.policy.base_model import load_base_model
            from evotrainer.policy.lora import LoraSettings, Policy

            model, tok = load_base_model(self.cfg.model, dtype=self.cfg.dtype, device=self.cfg.device,
                                         seed=self.cfg.seed)
            policy = Policy(model, tok, LoraSettings(**self.cfg.lora.model_dump()))
            policy.create("_scratch")  # keeps the PeftModel alive while branches come and go
        return policy

    @functools.cached_property
    def engine(self):
        from evotrainer.policy.rollout_engine import TransformersEngine

        return TransformersEngine(self.policy, batch_size=self.cfg.train.rollout_batch_size)

    def load_adapter(self, vid: str) -> None:
        """Loads a version's adapter (or a fresh one for a seed with none) under its id."""
        if vid in self.policy.branches:  # (the first use loads the model, timed as "load", not here)
            return
        vd = self.vdir(vid)
        with self.timed("adapter"):
            if (vd.adapter_dir / "adapter_config.json").is_file():
                self.policy.load(vid, vd.adapter_dir)
            else:
                self.policy.create(vid)

    def unload_adapter(self, vid: str) -> None:
        if vid in self.policy.branches:
            with self.timed("adapter"):
                self.policy.model.set_adapter("_scratch")
                self.policy.remove(vid)

    # ---- operators, labels, skills, lineage --------------------------------------------------
    @functools.cached_property
    def llm_budget(self):
        from evotrainer.operators.llm_client import TokenBudget

        b, llm = self.cfg.evolution.budget, self.cfg.evolution.llm
        used = self.state.budget_used
        budget = TokenBudget(b.llm_calls, b.llm_tokens, b.llm_cost_usd, llm.usd_per_1m_prompt_tokens,
                             llm.usd_per_1m_completion_tokens)
        budget.calls, budget.prompt_tokens = int(used.get("llm_calls", 0)), int(used.get("llm_tokens", 0))
        budget.cost_usd = float(used.get("llm_cost_usd", 0.0))
        return budget

    @functools.cached_property
    def mix(self):
        from evotrainer.operators.llm_client import LocalClient, OpenAIClient
        from evotrainer.operators.registry import OperatorMix

        ev = self.cfg.evolution
        weights = {"knobs": 1.0} if ev.mode == "recipe-search" else dict(ev.operators)
        llm = ev.llm
        if llm.base_url:
            client = OpenAIClient(llm.base_url, llm.model, api_key_env=llm.api_key_env, timeout=llm.timeout_s,
                                  budget=self.llm_budget)
        else:
            client = LocalClient(llm.model, budget=self.llm_budget, seed=self.cfg.seed)
        shared = {"client": client, "seed": self.cfg.seed, "max_tokens": llm.max_tokens,
                  "temperature": llm.temperature}
        # The knobs operator's Optuna study lives in the run dir, so a resumed run keeps learning from
        # the fitness of earlier knob settings instead of starting TPE over.
        fixed = {k: v for k, v in self.cfg.grpo.model_dump().items() if v is not None}
        by_name = {"knobs": {"storage": f"sqlite:///{self.run_dir.resolve()}/optuna.db", "fixed": fixed}
                   } if "knobs" in weights else {}
        return OperatorMix(weights, seed=self.cfg.seed, shared=shared, kwargs_by_name=by_name,
                           repair="llm_repair" in weights)

    def sync_llm_budget(self) -> None:
        if "llm_budget" in self.__dict__:
            self.state.budget_used["llm_calls"] = self.llm_budget.calls
            self.state.budget_used["llm_tokens"] = self.llm_budget.tokens
            self.state.budget_used["llm_cost_usd"] = self.llm_budget.cost_usd
        if "mix" in self.__dict__:
            self.state.operator_stats = self.mix.stats_dict()

    @functools.cached_property
    def labels(self):
        from evotrainer.fitness.labels import LabelStore

        return LabelStore(self.run_dir / "labels.json")

    @functools.cached_property
    def skills(self):
        from evotrainer.skills import SkillLibrary

        return SkillLibrary(self.run_dir / "skills.json", validate_after=self.cfg.evolution.skills_validate_after)

    @functools.cached_property
    def tracker(self):
        from evotrainer.lineage import LineageTracker

        return LineageTracker(self.run_dir)

    def record(self, vid: str) -> None:
        """MLflow run of a version (idempotent: keyed by version id, so resume makes no duplicates)."""
        with self.timed("record"):
            self.tracker.record(self.vdir(vid).path)

    def evidence_for(self, vid: str):
        from evotrainer.operators.base import Evidence

        vd = self.vdir(vid)
        report = json.loads((vd.path / "health.json").read_text()) if (vd.path / "health.json").is_file() else {}
        from evotrainer.skills import report_metrics

        skills = [s.prompt_dict() for s in self.skills.matching(report_metrics(report), self.cfg.domain.name)[:3]]
        known = {self.vdir(v).meta().genome_hash for v in self.versions()}
        return Evidence(health_report=report, skills=skills, history=self.state.history[-20:], known_hashes=known,
                        allow_multi_factor=self.cfg.evolution.allow_multi_factor)

    def after_gate(self, meta, control: str | None) -> None:
        """A confirmed intervention becomes (or confirms) a skill; knob results feed Optuna."""
        score = meta.metrics.get("heldout_accuracy")
        if meta.operator == "knobs" and "mix" in self.__dict__:
            knobs = self.mix.operator("knobs")
            if hasattr(knobs, "tell"):
                knobs.tell(meta.genome_hash, score if meta.status != "invalid" else None)
        for h in self.state.history:
            if h.get("child") == meta.id:
                h["outcome"] = meta.status
                h["heldout_accuracy"] = score
        if meta.status == "promoted" and meta.intervention:
            from evotrainer.skills import report_metrics

            parent_health = self.vdir(meta.parents[0]).path / "health.json"
            trigger = report_metrics(json.loads(parent_health.read_text())) if parent_health.is_file() else {}
            self.skills.record_confirmed(meta.intervention, meta.decision or {}, self.cfg.domain.name, trigger,
                                         version=meta.id, parent=control)

    # ---- budgets -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def timed(self, key: str):
        """Adds the block's wall seconds to ``budget_used[key_seconds]``: where a run's time went."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.spend(**{f"{key}_seconds": time.perf_counter() - t0})

    def spend(self, **amounts: float) -> None:
        for k, v in amounts.items():
            self.state.budget_used[k] = self.state.budget_used.get(k, 0) + v

    def guard(self) -> None:
        """Raises BudgetReached when any configured budget is spent."""
        b, used = self.cfg.evolution.budget, self.state.budget_used
        self.sync_llm_budget()
        for name in ("train_steps", "rollout_tokens", "wall_time_s", "llm_calls", "llm_tokens", "llm_cost_usd"):
            limit = getattr(b, name)
            if limit is not None and used.get(name, 0) >= limit:
                raise BudgetReached(f"{name} budget spent ({used[name]:.4g} of {limit})")

    # ---- the end of a run ----------------------------------------------------------------------
    def finish(self) -> None:
        try:
            with self.timed("finish"):
                self.tracker.record_all()  # idempotent sweep: every version has its run, statuses current
                self.tracker.log_plots()
        except Exception as e:  # noqa: BLE001 - a plot failure must not lose a finished run
            self.say(f"could not log plots: {e}")
        if self.cfg.evolution.user_skills:
            try:
                from evotrainer.skills import SkillLibrary

                self.skills.merge_into(SkillLibrary.user())
            except Exception as e:  # noqa: BLE001
                self.say(f"could not update the user skill library: {e}")

    def leaderboard(self) -> Table:
        table = Table(title=f"leaderboard — {self.run_dir}")
        for col in ("version", "gen", "operator", "factor", "held-out", "train reward", "status"):
            table.add_column(col, overflow="fold")   # a narrow terminal wraps a factor, never cuts it
        metas = [self.vdir(v).meta() for v in self.versions()]
        metas.sort(key=lambda m: -(m.metrics.get("heldout_accuracy") or -1))
        for m in metas:
            acc = m.metrics.get("heldout_accuracy")
            style = "red" if m.status == "invalid" else "green" if m.status == "promoted" else None
            table.add_row(m.id, str(m.generation), m.operator or "-", m.factor or "-",
                          f"{acc:.3f}" if acc is not None else "-",
                          f"{m.metrics.get('train_reward_mean', float('nan')):.3f}", m.status, style=style)
        return table

    def print_summary(self, console: Console | None = None) -> None:
        console = console or Console()
        console.print(self.leaderboard())
        invalid = [self.vdir(v).meta() for v in self.versions() if self.vdir(v).meta().status == "invalid"]
        if invalid:
            console.print("[red]invalid branches[/red]")
            for m in invalid:
                for r in (m.decision or {}).get("reasons", [])[:4]:
                    console.print(f"  {m.id}: {r}")
        used = self.state.budget_used
        console.print(f"status: {self.state.status}" + (f" ({self.state.stop_reason})" if self.state.stop_reason else "")
                      + f"; train steps {used.get('train_steps', 0):.0f}, rollout tokens "
                      f"{used.get('rollout_tokens', 0):.0f}, LLM calls {used.get('llm_calls', 0):.0f}, "
                      f"wall {used.get('wall_time_s', 0):.0f} s")
        wall = used.get("wall_time_s", 0)
        parts = sorted(((TIME_LABELS.get(k[: -len("_seconds")], k[: -len("_seconds")]), v)
                        for k, v in used.items() if k.endswith("_seconds")), key=lambda kv: -kv[1])
        if wall and parts:
            console.print("where the time went: "
                          + ", ".join(f"{name} {v / wall:.1%}" for name, v in parts if v / wall >= 0.001))
        console.print(f"open the lineage in MLflow: mlflow ui --backend-store-uri sqlite:///{self.run_dir}/mlflow.db")
