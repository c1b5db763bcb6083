"""The GRPO trainer's settings (TRL names), without torch: the genome layer's contract check reads
the field names to tell a knob training reads from one it would silently drop.

Every field here is read by ``policy/grpo.py`` or ``policy/train_step.py``. Settings that only a
harness hook reads (``scale_rewards``, read by the ``advantages`` hook) are harness knobs, not
fields: a field that no part of training reads would be accepted and silently ignored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from evotrainer.domains.swe.token_edits import EDIT_FORMS

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


@dataclass
class GRPOConfig:
    learning_rate: float = 1e-4
    num_generations: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    max_completion_length: int = 64
    beta: float = 0.0                  # KL(π || π_ref) coefficient; π_ref = base model (adapter disabled)
    epsilon: float = 0.2               # lower clip
    epsilon_high: float = 0.28         # upper clip (clip-higher)
    delta: float | None = None         # dual clip: cap on the ratio before min (None = off)
    use_bias_correction_kl: bool = True  # weight the KL term by the importance ratio (TRL's default)
    loss_type: str = "dapo"
    mask_truncated_completions: bool = False
    # Sequences per forward/backward. All micro-batches of a step accumulate into one optimiser step,
    # so TRL's gradient_accumulation_steps is implied (ceil(batch / this)) and is not a setting here.
    per_device_train_batch_size: int = 16
    num_iterations: int = 1            # optimisation passes over each generation batch
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    # Episodes: the share of each group whose tool calls are decoded under the domain's call grammar
    # (guided exploration; policy/guided_decoding.py). Held-out and test episodes are never guided.
    guided_call_share: float = 0.0
    # ... and the share that also follows the tool plan (read_file, edit, run_tests, submit): the
    # policy still chooses the file, the line an edit replaces, the new text and the tests.
    guided_plan_share: float = 0.0
    # What a guided edit may write in place of the line it names: "line" any one line; "token" the
    # line with one operator, comparison or integer changed (domains/swe/token_edits.py); "quoted" as
    # "token", on a line the issue quotes where it quotes one (level 0).
    guided_edit: str = "line"
    # Episodes: the weight of a behaviour-cloning term on the tokens of guided episodes' accepted calls
    # (policy/imitation.py), added to the policy loss whatever their advantage: a step whose groups are
    # all dead still learns the calls' form from them. 0: the policy gradient alone.
    guided_imitation: float = 0.0

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        for name in ("guided_call_share", "guided_plan_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {getattr(self, name)}")
        if not self.guided_imitation >= 0.0:
            raise ValueError(f"guided_imitation must be >= 0, got {self.guided_imitation}")
        if self.guided_edit not in EDIT_FORMS:
            raise ValueError(f"guided_edit must be one of {EDIT_FORMS}, got {self.guided_edit!r}")
        if self.num_generations < 2:
            raise ValueError("num_generations must be >= 2: a group of one has no relative advantage")

    def to_dict(self) -> dict:
        return asdict(self)


TRAINER_SETTINGS = frozenset(f.name for f in fields(GRPOConfig))
# The settings that shape the sampled rollouts (how many, how long, how random, how guided:
# ``train_step.step_params`` and the group size). Every other setting acts only inside a gradient step,
# which the trainer skips when no rollout carries an advantage, ``beta`` is 0 and nothing is imitated.
SAMPLING_SETTINGS = frozenset({"num_generations", "temperature", "top_p", "max_completion_length",
                               "guided_call_share", "guided_plan_share", "guided_edit"})
