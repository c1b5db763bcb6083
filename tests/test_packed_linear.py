"""Frozen linears on packed weights (policy/packed_linear.py): the same outputs and input gradients as
F.linear, a weight written in place is packed again, trainable weights are left alone."""

import pytest
import torch

from evotrainer.policy.base_model import load_base_model
from evotrainer.policy.grpo import GRPOConfig, GRPOTrainer
from evotrainer.policy.kv_decoder import PACKED
from evotrainer.policy.lora import LoraSettings, Policy
from evotrainer.policy.packed_linear import pack_frozen_linears
from evotrainer.records.rollout import Rollout

pytestmark = pytest.mark.skipif(not PACKED, reason="this torch build has no oneDNN packed linear kernels")


def _frozen(n_in=24, n_out=40, bias=True):
    torch.manual_seed(0)
    lin = torch.nn.Linear(n_in, n_out, bias=bias)
    lin.weight.requires_grad_(False)
    if bias:
        lin.bias.requires_grad_(False)
    ref = torch.nn.Linear(n_in, n_out, bias=bias)
    ref.load_state_dict(lin.state_dict())
    return lin, ref


def test_outputs_and_input_gradients_equal_f_linear():
    lin, ref = _frozen()
    assert pack_frozen_linears(lin) == 1
    x = torch.randn(3, 5, 24, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y, y2 = lin(x), ref(x2)
    assert torch.allclose(y, y2, atol=1e-5)
    g = torch.randn_like(y)
    y.backward(g)
    y2.backward(g)
    assert torch.allclose(x.grad, x2.grad, atol=1e-5)
    assert lin.weight.grad is None   # frozen: no weight gradient is made


def test_a_weight_written_in_place_is_packed_again():
    lin, ref = _frozen(bias=False)
    pack_frozen_linears(lin)
    x = torch.randn(4, 24)
    lin(x)
    with torch.no_grad():
        lin.weight.mul_(2.0)
        ref.weight.mul_(2.0)
    assert torch.allclose(lin(x), ref(x), atol=1e-5)


def test_trainable_weights_and_other_dtypes_take_f_linear():
    lin, ref = _frozen()
    pack_frozen_linears(lin)
    lin.weight.requires_grad_(True)
    x = torch.randn(2, 24)
    lin(x).sum().backward()
    assert lin.weight.grad is not None     # F.linear path: the weight trains
    assert torch.allclose(lin(x.double().float()), ref(x), atol=1e-5)


def test_a_grpo_step_gives_the_same_update_packed_or_not():
    """The trainer on a packed policy and on a plain one: the same LoRA gradients and update."""
    grads = {}
    for packed in (True, False):
        model, tok = load_base_model("tiny-random", seed=0, initializer_range=0.2)
        pol = Policy(model, tok, LoraSettings(r=4, lora_alpha=8), packed=packed)
        torch.manual_seed(1)
        pol.create("b0")
        with torch.no_grad():
            for p in pol.parameters("b0"):
                p.add_(torch.randn_like(p) * 0.1)
        g = torch.Generator().manual_seed(0)
        rollouts = [Rollout(task_id=str(i // 2), messages=[], completion="",
                            prompt_ids=torch.randint(5, 2000, (6 + i // 2,), generator=g).tolist(),
                            completion_ids=torch.randint(5, 2000, (4,), generator=g).tolist(),
                            logprobs=[-2.0] * 4, group=i // 2) for i in range(4)]
        for r in rollouts[1::2]:
            r.prompt_ids = rollouts[0].prompt_ids if r.group == 0 else rollouts[2].prompt_ids
        tr = GRPOTrainer(pol, "b0", GRPOConfig(learning_rate=1e-2, num_generations=2))
        with torch.no_grad(), pol.adapter("b0") as m:   # the sampler's logprobs: ratios start at 1
            lp = tr._logps(m, tr._batch(rollouts))
        for r, row in zip(rollouts, lp):
            r.logprobs = row[:4].tolist()
        tr.step(rollouts, [1.0, -1.0, 0.5, -0.5])
        grads[packed] = [p.grad.clone() for p in tr.params]
    assert any(float(g.abs().max()) > 1e-4 for g in grads[True])
    for a, b in zip(grads[True], grads[False]):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
