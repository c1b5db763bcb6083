"""OpenAIClient against a chat-completions server started in the test on 127.0.0.1; TokenBudget."""

import json
import time

import pytest

from evotrainer.operators.llm_client import (
    BudgetExhausted,
    Completion,
    LLMError,
    OpenAIClient,
    TokenBudget,
    make_client,
)
from tests.chat_server import ChatServer

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say ok"}]


def client(url, **kw):
    kw = {"timeout": 5.0, "max_retries": 2, "backoff": 0.01, **kw}
    return OpenAIClient(url, "test-model", **kw)


def test_completion_and_token_accounting():
    with ChatServer([("ok", "ok!")]) as srv:
        budget = TokenBudget(max_calls=10)
        c = client(srv.url, budget=budget)
        out = c.complete(MESSAGES, max_tokens=32, temperature=0.0)
    assert out == Completion("ok!", 21, 4)
    req = srv.requests[0]
    assert req["path"] == "/v1/chat/completions"
    assert req["body"]["model"] == "test-model" and req["body"]["messages"] == MESSAGES
    assert req["body"]["max_tokens"] == 32 and req["body"]["temperature"] == 0.0
    assert (c.calls, c.prompt_tokens, c.completion_tokens) == (1, 21, 4)
    assert budget.to_dict()["calls"] == 1 and budget.tokens == 25


@pytest.mark.parametrize("code", [500, 503, 429])
def test_retries_transient_errors_then_succeeds(code):
    with ChatServer([("status", code), ("status", code), ("ok", "fine")]) as srv:
        c = client(srv.url)
        assert c.complete(MESSAGES).text == "fine"
    assert len(srv.requests) == 3 and c.retries == 2


def test_gives_up_after_max_retries():
    with ChatServer([("status", 500)]) as srv, pytest.raises(LLMError, match="InternalServerError"):
        client(srv.url, max_retries=1).complete(MESSAGES)
    assert len(srv.requests) == 2


def test_client_errors_are_not_retried():
    with ChatServer([("status", 400)]) as srv, pytest.raises(LLMError, match="BadRequestError"):
        client(srv.url).complete(MESSAGES)
    assert len(srv.requests) == 1


def test_timeout_is_retried_then_reported():
    with ChatServer([("sleep", 8.0)]) as srv:
        t0 = time.monotonic()
        with pytest.raises(LLMError, match="Timeout"):
            client(srv.url, timeout=0.3, max_retries=1).complete(MESSAGES)
        # Two 0.3 s attempts, not the server's 8 s: the bound leaves a loaded machine ample slack.
        assert time.monotonic() - t0 < 6.0
    assert len(srv.requests) == 2


def test_timeout_then_success():
    heard = []
    with ChatServer([("sleep", 1.0), ("ok", "second try")]) as srv:
        assert client(srv.url, timeout=0.3, on_wait=heard.append).complete(MESSAGES).text == "second try"
    retries = [m for m in heard if "retry 1 of 2" in m]
    assert len(retries) == 1 and "APITimeoutError" in retries[0], heard   # the retry is said, not only counted


def test_connection_refused_is_an_llm_error():
    with ChatServer([("ok", "x")]) as srv:
        url = srv.url
    with pytest.raises(LLMError, match="Connection"):
        client(url, max_retries=1).complete(MESSAGES)


def test_budget_stops_calls_before_they_happen():
    budget = TokenBudget(max_calls=2)
    with ChatServer([("ok", "ok")]) as srv:
        a, b = client(srv.url, budget=budget), client(srv.url, budget=budget)   # shared by two clients
        a.complete(MESSAGES)
        b.complete(MESSAGES)
        with pytest.raises(BudgetExhausted, match="call budget"):
            a.complete(MESSAGES)
    assert len(srv.requests) == 2


def test_token_budget_refuses_a_call_that_could_exceed_it():
    budget = TokenBudget(max_tokens=100)
    with ChatServer([("ok", "ok")]) as srv:
        c = client(srv.url, budget=budget)
        c.complete(MESSAGES, max_tokens=50)           # ~5 prompt + 50 ≤ 100; charges 25 real tokens
        with pytest.raises(BudgetExhausted, match="token budget"):
            c.complete(MESSAGES, max_tokens=80)       # 25 used + ~5 + 80 > 100
        c.complete(MESSAGES, max_tokens=40)           # still fits
    assert len(srv.requests) == 2 and budget.tokens == 50


def test_cost_budget_prices_real_usage_and_refuses_a_call_that_could_exceed_it():
    # $1 per 1k prompt tokens, $2 per 1k reply tokens; the server reports 21 prompt + 4 reply tokens.
    budget = TokenBudget(max_cost_usd=0.1, usd_per_1m_prompt=1000.0, usd_per_1m_completion=2000.0)
    with ChatServer([("ok", "ok")]) as srv:
        c = client(srv.url, budget=budget)
        c.complete(MESSAGES, max_tokens=20)       # worst case ~5*0.001 + 20*0.002 = $0.045 fits
        assert budget.cost_usd == pytest.approx(21 * 0.001 + 4 * 0.002)
        with pytest.raises(BudgetExhausted, match="cost budget"):
            c.complete(MESSAGES, max_tokens=40)   # $0.029 used + up to ~$0.085 > $0.1
        c.complete(MESSAGES, max_tokens=20)
    assert len(srv.requests) == 2 and budget.cost_usd == pytest.approx(2 * 0.029)


def test_make_client_prefers_a_server_url(monkeypatch):
    monkeypatch.delenv("EVOTRAINER_LLM_URL", raising=False)
    c = make_client("http://127.0.0.1:9/v1", "m")
    assert isinstance(c, OpenAIClient) and c.model == "m"
    with pytest.raises(ValueError, match="needs a model name"):
        make_client("http://127.0.0.1:9/v1")


def test_mutate_command_with_an_llm_server(capsys):
    """`evotrainer mutate --operator llm_diff --llm-url ...` against the test server."""
    from pathlib import Path

    from evotrainer.genome.program import REFERENCE_PATH
    from evotrainer.cli.mutate import main

    reply = (Path(__file__).parent / "fixtures" / "llm_replies" / "diff_keep_groups.txt").read_text()
    with ChatServer([("ok", reply), ("ok", "I think you should raise the learning rate.")]) as srv:
        argv = ["mutate", str(REFERENCE_PATH), "--operator", "llm_diff", "--llm-url", srv.url, "--llm-model", "m"]
        code, printed = main(argv), capsys.readouterr()
        assert code == 0, printed.err
        out = json.loads(printed.out)
        assert out["factor"] == "hook:keep_groups" and out["prompt_tokens"] == 21
        assert main(argv) == 1
        err = json.loads(capsys.readouterr().err)
        assert err["kind"] == "parse" and "HYPOTHESIS" in err["reason"]
    assert "REQUIRED REPLY FORMAT" in srv.requests[0]["body"]["messages"][-1]["content"]


def test_local_client_on_the_tiny_model(tiny):
    """LocalClient through transformers: chat template, exact token counts, greedy determinism, budget."""
    from evotrainer.operators.llm_client import LocalClient

    model, tokenizer = tiny
    budget = TokenBudget(max_calls=3)
    client = LocalClient(model=model, tokenizer=tokenizer, budget=budget, threads=1)
    a = client.complete(MESSAGES, max_tokens=8, temperature=0.0)
    b = client.complete(MESSAGES, max_tokens=8, temperature=0.0)
    assert a == b and isinstance(a.text, str) and 0 < a.completion_tokens <= 8
    expected_prompt = len(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                                        return_dict=True)["input_ids"])
    assert a.prompt_tokens == expected_prompt
    sampled = client.complete(MESSAGES, max_tokens=8, temperature=1.0)
    assert 0 < sampled.completion_tokens <= 8 and client.calls == 3
    assert budget.tokens == client.prompt_tokens + client.completion_tokens
    with pytest.raises(BudgetExhausted):
        client.complete(MESSAGES, max_tokens=8)


def test_local_client_reserves_the_tokenizers_count_not_characters_over_four(tiny):
    """The chat template adds tokens the characters ÷ 4 estimate never sees: a token budget that the
    estimate fits but the real prompt does not refuses the call before it is made."""
    from evotrainer.operators.llm_client import LocalClient, estimate_tokens

    model, tokenizer = tiny
    real = len(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"])
    guess = sum(estimate_tokens(m["content"]) for m in MESSAGES)
    assert real > guess
    budget = TokenBudget(max_tokens=guess + 8)    # the estimate would have let this call through
    client = LocalClient(model=model, tokenizer=tokenizer, budget=budget, threads=1)
    with pytest.raises(BudgetExhausted, match="token budget"):
        client.complete(MESSAGES, max_tokens=8, temperature=0.0)
    assert budget.calls == 0 and budget.tokens == 0
    budget.max_tokens = real + 8
    assert client.complete(MESSAGES, max_tokens=8, temperature=0.0).prompt_tokens == real
    assert budget.tokens <= budget.max_tokens
