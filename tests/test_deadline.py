"""Bounded waits: a server that accepts and never replies ends a proposal by its deadline, with a
message while waiting (a real socket server on 127.0.0.1, the real client, operator and CLI)."""

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from evotrainer.config import ConfigError, parse_config
from evotrainer.genome.program import reference_program
from evotrainer.loop.knowledge.operator_mix import operator_mix
from evotrainer.operators.base import OperatorError
from evotrainer.operators.evidence import Evidence
from evotrainer.operators.llm_client import LLMError, OpenAIClient, TokenBudget

ROOT = Path(__file__).resolve().parents[1]
MESSAGES = [{"role": "user", "content": "say ok"}]


@pytest.fixture
def silent_server():
    """Accepts every connection and never sends a byte."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.settimeout(0.1)
    held, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except socket.timeout:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", held
    stop.set()
    thread.join()
    for c in held:
        c.close()
    sock.close()


def test_one_deadline_bounds_every_call_and_retry(silent_server):
    url, held = silent_server
    heard = []
    budget = TokenBudget()
    client = OpenAIClient(url, "m", timeout=120, max_retries=3, backoff=0.05, budget=budget,
                          on_wait=heard.append, notice_s=0.3)
    t0 = time.monotonic()
    with client.deadline(1.5):
        with pytest.raises(LLMError, match="deadline of 1.5 s"):
            client.complete(MESSAGES, max_tokens=16)
        waited = time.monotonic() - t0
        calls = budget.calls
        with pytest.raises(LLMError, match="deadline"):   # the deadline has passed: no request at all
            client.complete(MESSAGES, max_tokens=16)
    assert 1.4 <= waited < 20.0, waited          # the 1.5 s deadline, not 120 s x 4 tries (slack for a loaded box)
    assert held, "the server did accept the connection"
    assert heard and "waiting for the LLM" in heard[0] and "of 1.5 s" in heard[0]
    assert budget.calls == calls                 # the refused call reserved nothing


def test_a_loop_proposal_ends_by_proposal_timeout_s(silent_server, tmp_path):
    url, _ = silent_server
    cfg = parse_config({"evolution": {"operators": {"llm_diff": 1.0},
                                      "llm": {"base_url": url, "model": "m", "timeout_s": 120,
                                              "proposal_timeout_s": 1.5}}})
    heard = []
    mix = operator_mix(cfg, tmp_path, TokenBudget(), say=heard.append)
    mix.shared["client"].notice_s = 0.3
    t0 = time.monotonic()
    with pytest.raises(OperatorError):
        mix.propose([reference_program()], Evidence(), attempts=3)   # three draws share the deadline
    assert time.monotonic() - t0 < 30.0   # one shared deadline, not three proposals' worth (slack for load)
    assert any("waiting for the LLM" in m for m in heard)


def test_mutate_against_a_silent_server_stops_at_its_timeout(silent_server, tmp_path):
    url, _ = silent_server
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "evotrainer.cli", "mutate",
                           str(ROOT / "evotrainer" / "genome" / "reference_harness.py"), "--operator", "llm_diff",
                           "--llm-url", url, "--llm-model", "m", "--timeout", "2"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "waiting for the LLM" in done.stderr and "deadline of 2 s" in done.stderr
    assert time.monotonic() - t0 < 60


def test_sizes_that_drive_compute_are_bounded():
    for field, value in (("train.eval_max_new_tokens", 10**7), ("grpo.max_completion_length", 10**7),
                         ("train.steps", 10**9), ("evolution.llm.proposal_timeout_s", 0)):
        section, _, name = field.rpartition(".")
        data: dict = {}
        node = data
        for part in section.split("."):
            node = node.setdefault(part, {})
        node[name] = value
        with pytest.raises(ConfigError, match=name):
            parse_config(data)
