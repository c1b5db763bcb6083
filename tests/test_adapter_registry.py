"""Served adapters: a name and id per (branch, weights); changed weights never reuse either."""

import json

import torch
from safetensors.torch import load_file

from evotrainer.policy.adapter_registry import AdapterRegistry
from evotrainer.policy.lora import Policy


def test_changed_weights_get_a_new_name_and_an_id_never_used_before(tiny, tmp_path):
    model, tok = tiny
    policy = Policy(model, tok)
    policy.create("v1")
    policy.create("v2")
    reg = AdapterRegistry(tmp_path)
    first, superseded = reg.export(policy, "v1")
    assert superseded is None and first.zero and first.lora_id == 1
    assert json.loads((first.path / "adapter_config.json").read_text())["r"] == policy.lora.r
    again, superseded = reg.export(policy, "v1")
    assert again == first and superseded is None                      # same weights: same adapter
    other, _ = reg.export(policy, "v2")
    assert other.lora_id == 2 and other.name != first.name
    with torch.no_grad():
        next(p for n, p in policy.model.named_parameters() if ".v1." in n and "lora_B" in n).add_(0.1)
    changed, superseded = reg.export(policy, "v1")
    assert superseded == first and changed.lora_id == 3 and changed.name != first.name and not changed.zero
    files = load_file(str(changed.path / "adapter_model.safetensors"))
    assert any(t.abs().max() > 0 for k, t in files.items() if "lora_B" in k)   # the files hold the new weights
    reg.forget(superseded)
    assert not first.path.exists() and changed.path.exists()
    with torch.no_grad():   # back to the old weights: still a fresh id (an id names one export, once)
        next(p for n, p in policy.model.named_parameters() if ".v1." in n and "lora_B" in n).sub_(0.1)
    back, _ = reg.export(policy, "v1")
    assert back.digest == first.digest and back.lora_id == 4


def test_unchanged_weights_are_not_hashed_again(tiny, tmp_path, monkeypatch):
    """Every generate call (every SWE turn) exports its adapter: the sha256 over every tensor runs only
    when a tensor was written to since the last export, which an optimizer step always does."""
    import evotrainer.policy.adapter_registry as registry

    model, tok = tiny
    policy = Policy(model, tok)
    policy.create("v1")
    hashed = []
    real = registry.adapter_digest
    monkeypatch.setattr(registry, "adapter_digest", lambda p, b: hashed.append(b) or real(p, b))
    reg = AdapterRegistry(tmp_path)
    first, _ = reg.export(policy, "v1")
    for _ in range(3):
        assert reg.export(policy, "v1") == (first, None)
    assert hashed == ["v1"]
    params = policy.parameters("v1")
    loss = sum((p * p).sum() for p in params) + sum(p.sum() for p in params)
    loss.backward()
    torch.optim.AdamW(params, lr=1e-2).step()          # in place, as training does
    stepped, superseded = reg.export(policy, "v1")
    assert hashed == ["v1", "v1"] and superseded == first and stepped.digest != first.digest
