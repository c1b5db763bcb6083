import os

import pytest

from tests.swebench_instance import write_swebench_instance

# Tests never touch a hub; keep converted models in the user cache shared across runs.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="module")
def tiny():
    """A tiny random model of SmolLM2's architecture with SmolLM2's tokenizer: (model, tokenizer).

    One per test module (a load takes about a second): a module that wraps it in peft or trains an
    adapter on it changes it in place, and no other module may see that."""
    from evotrainer.policy.base_model import load_base_model

    return load_base_model("tiny-random", seed=0)


@pytest.fixture
def swebench_dir(tmp_path):
    """(directory, record): one SWE-bench instance over a local git clone (``tests/swebench_instance.py``)."""
    return write_swebench_instance(tmp_path)
