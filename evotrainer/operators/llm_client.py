"""LLM clients for the mutation operators: any OpenAI-compatible server, or the local base model.

Both count tokens and draw on an optional shared ``TokenBudget``; when the budget would be
exceeded, ``complete`` raises ``BudgetExhausted`` *before* calling, so an experiment stops using
LLMs cleanly and keeps searching with the other operators.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, runtime_checkable

Message = dict[str, str]   # {"role": "system"|"user"|"assistant", "content": "..."}


class LLMError(RuntimeError):
    """The LLM could not answer (server down after retries, bad request, ...)."""


class BudgetExhausted(LLMError):
    """The shared token/call budget would be exceeded by the next call."""


@dataclass
class Completion:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


@runtime_checkable
class LLMClient(Protocol):
    """``complete`` may also take ``json_schema=`` (a JSON schema the reply must follow): both clients
    here do; an operator checks with ``accepts_json_schema`` before passing it to another client."""

    def complete(self, messages: list[Message], max_tokens: int = 1024, temperature: float = 0.7) -> Completion: ...


def accepts_json_schema(client: Any) -> bool:
    """Whether ``client.complete`` takes a ``json_schema`` keyword (constrained or structured output)."""
    try:
        params = inspect.signature(client.complete).parameters
    except (TypeError, ValueError):
        return False
    return "json_schema" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def estimate_tokens(text: str) -> int:
    """Rough token count (~4 characters a token) for budgeting before a call and when a server
    reports no usage."""
    return max(1, len(text) // 4)


class TokenBudget:
    """Calls, tokens and dollars shared by every client of one experiment (thread-safe).

    ``reserve`` is conservative: a call is refused if its prompt (counted with the tokenizer where the
    client has one, else estimated as characters ÷ 4) plus its full
    ``max_tokens`` completion could go over ``max_tokens`` (or, priced per million tokens, over
    ``max_cost_usd``); ``charge`` then books the real usage.
    """

    def __init__(self, max_calls: int | None = None, max_tokens: int | None = None, max_cost_usd: float | None = None,
                 usd_per_1m_prompt: float = 0.0, usd_per_1m_completion: float = 0.0,
                 on_change: Callable[[], None] | None = None) -> None:
        # Called after every reserve and charge: the run persists its count then, not only with the next
        # stage, so a call made just before a crash is not lost from the count.
        self.on_change = on_change
        self.max_calls = max_calls
        self.max_tokens = max_tokens
        self.max_cost_usd = max_cost_usd
        self.usd_per_1m_prompt = usd_per_1m_prompt
        self.usd_per_1m_completion = usd_per_1m_completion
        self.calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost_usd = 0.0
        self._lock = threading.Lock()

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def price(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.usd_per_1m_prompt + completion_tokens * self.usd_per_1m_completion) / 1e6

    def reserve(self, prompt_estimate: int, max_new_tokens: int) -> None:
        with self._lock:
            if self.max_calls is not None and self.calls + 1 > self.max_calls:
                raise BudgetExhausted(f"LLM call budget spent ({self.calls}/{self.max_calls} calls)")
            if self.max_tokens is not None and self.tokens + prompt_estimate + max_new_tokens > self.max_tokens:
                raise BudgetExhausted(
                    f"LLM token budget would be exceeded ({self.tokens} used + up to "
                    f"{prompt_estimate + max_new_tokens} > {self.max_tokens})"
                )
            worst = self.price(prompt_estimate, max_new_tokens)
            if self.max_cost_usd is not None and self.cost_usd + worst > self.max_cost_usd:
                raise BudgetExhausted(f"LLM cost budget would be exceeded (${self.cost_usd:.4f} used + up to "
                                      f"${worst:.4f} > ${self.max_cost_usd:.4f})")
            self.calls += 1
        if self.on_change:
            self.on_change()

    def charge(self, prompt_tokens: int, completion_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.completion_tokens += completion_tokens
            self.cost_usd += self.price(prompt_tokens, completion_tokens)
        if self.on_change:
            self.on_change()

    def to_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "cost_usd": self.cost_usd, "max_calls": self.max_calls, "max_tokens": self.max_tokens,
                "max_cost_usd": self.max_cost_usd}


class _Accounting:
    """Token totals per client plus the shared budget hooks."""

    budget: TokenBudget | None

    def _init_accounting(self, budget: TokenBudget | None) -> None:
        self.budget = budget
        self.calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def _before(self, messages: list[Message], max_tokens: int, prompt_tokens: int | None = None) -> None:
        """Reserves the call: ``prompt_tokens`` when the client can count them (a known tokenizer),
        else the characters ÷ 4 estimate."""
        if self.budget is not None:
            if prompt_tokens is None:
                prompt_tokens = sum(estimate_tokens(m.get("content", "")) for m in messages)
            self.budget.reserve(prompt_tokens, max_tokens)

    def _after(self, c: Completion) -> Completion:
        self.calls += 1
        self.prompt_tokens += c.prompt_tokens
        self.completion_tokens += c.completion_tokens
        if self.budget is not None:
            self.budget.charge(c.prompt_tokens, c.completion_tokens)
        return c


# How an OpenAI-compatible server is asked to follow a reply's JSON schema:
#   "json_schema": ``response_format={"type": "json_schema", ...}`` (OpenAI's structured outputs; vLLM,
#                  SGLang and llama.cpp's server accept it too);
#   "structured_outputs": vLLM's own request field, ``structured_outputs={"json": schema}`` (in
#                  ``extra_body``; vLLM >= 0.12, which dropped ``guided_json`` and answers a request that
#                  still sends it unconstrained, with HTTP 200 and no error: so it is not offered);
#   None: not at all: the prompt alone asks for the JSON, and the operator checks the reply.
# The schemas ``llm_choice`` sends are an ``anyOf`` of objects at the root, which vLLM, SGLang and
# llama.cpp accept; OpenAI's hosted strict mode wants an object at the root and may refuse them.
STRUCTURED_OUTPUT = ("json_schema", "structured_outputs", None)


class OpenAIClient(_Accounting):
    """Chat completions from an OpenAI-compatible server (vLLM, llama.cpp, a hosted API).

    Retries connection errors, timeouts, 429 and 5xx up to ``max_retries`` times with exponential
    backoff (``backoff * 2**attempt`` seconds); other HTTP errors fail at once. Retries are ours,
    not the openai package's, so that they are counted and their timing is under our control.

    Inside ``with client.deadline(seconds):`` every call shares one total deadline (one proposal may
    make several calls): each request's timeout and each backoff is cut to the time left, and a call
    once it has passed fails at once. Without it, a server that accepts and never answers held a
    proposal for ``timeout`` × (retries + 1) per call. ``on_wait`` hears every ``notice_s`` seconds
    that a request is still waiting, so a silent server is never a silent hang.
    """

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout: float = 120.0,
                 max_retries: int = 3, backoff: float = 1.0, budget: TokenBudget | None = None,
                 extra_body: dict[str, Any] | None = None, structured_output: str | None = "json_schema",
                 on_wait: Callable[[str], None] | None = None, notice_s: float = 15.0) -> None:
        # openai is needed only when a server is used
        import openai

        if structured_output not in STRUCTURED_OUTPUT:
            raise ValueError(f"unknown structured_output {structured_output!r}; use one of "
                             f"{', '.join(map(str, STRUCTURED_OUTPUT))}")
        self.structured_output = structured_output

        self._openai = openai
        self.base_url = base_url
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.extra_body = extra_body
        self.retries = 0
        self.on_wait, self.notice_s = on_wait, notice_s
        self._deadline: float | None = None      # monotonic time, inside ``deadline()``
        self._deadline_s = 0.0
        # Local servers need no key; the openai package insists on one, so pass a placeholder.
        api_key = os.environ.get(api_key_env) or "EMPTY"
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0)
        self._init_accounting(budget)

    def _retryable(self, err: Exception) -> bool:
        o = self._openai
        if isinstance(err, (o.APIConnectionError, o.APITimeoutError)):   # includes timeouts
            return True
        if isinstance(err, o.APIStatusError):
            return err.status_code == 429 or err.status_code >= 500
        return False

    @contextlib.contextmanager
    def deadline(self, seconds: float | None) -> Iterator[None]:
        """Every call in the block shares one deadline ``seconds`` from now (None: no deadline)."""
        previous = self._deadline, self._deadline_s
        if seconds is not None:
            self._deadline, self._deadline_s = time.monotonic() + seconds, seconds
        try:
            yield
        finally:
            self._deadline, self._deadline_s = previous

    def _left(self) -> float:
        """Seconds left before the deadline (the plain timeout without one); LLMError once passed."""
        if self._deadline is None:
            return self.timeout
        left = self._deadline - time.monotonic()
        if left <= 0.05:
            raise LLMError(f"LLM server {self.base_url} gave no answer within the proposal's deadline of "
                           f"{self._deadline_s:g} s (evolution.llm.proposal_timeout_s, mutate --timeout)")
        return min(self.timeout, left)

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[None]:
        """Says every ``notice_s`` seconds that the request is still waiting (a daemon ticker)."""
        done = threading.Event()
        t0 = time.monotonic()

        def tick() -> None:
            while not done.wait(self.notice_s):
                limit = f" of {self._deadline_s:g} s" if self._deadline is not None else ""
                self.on_wait(f"waiting for the LLM at {self.base_url}: {time.monotonic() - t0:.0f} s{limit}")

        ticker = threading.Thread(target=tick, daemon=True) if self.on_wait else None
        if ticker:
            ticker.start()
        try:
            yield
        finally:
            done.set()

    def _schema_kwargs(self, json_schema: dict[str, Any] | None) -> dict[str, Any]:
        """How the server is asked to follow ``json_schema`` (see ``STRUCTURED_OUTPUT``)."""
        extra = dict(self.extra_body or {})
        out: dict[str, Any] = {}
        if json_schema is not None and self.structured_output == "json_schema":
            out["response_format"] = {"type": "json_schema", "json_schema": {"name": "reply", "schema": json_schema}}
        elif json_schema is not None and self.structured_output == "structured_outputs":
            extra["structured_outputs"] = {"json": json_schema}
        return {**out, **({"extra_body": extra} if extra else {})}

    def complete(self, messages: list[Message], max_tokens: int = 1024, temperature: float = 0.7,
                 json_schema: dict[str, Any] | None = None) -> Completion:
        self._left()   # a deadline already passed: no call, no budget spent
        self._before(messages, max_tokens)
        last: Exception | None = None
        for attempt in range(self.max_retries + 1):
            try:
                with self._waiting():
                    response = self._client.with_options(timeout=self._left()).chat.completions.create(
                        model=self.model, messages=messages, max_tokens=max_tokens, temperature=temperature,
                        **self._schema_kwargs(json_schema),
                    )
                break
            except self._openai.OpenAIError as err:
                last = err
                if not self._retryable(err) or attempt == self.max_retries:
                    raise LLMError(f"LLM request to {self.base_url} failed: {type(err).__name__}: {err}") from err
                self.retries += 1
                pause = self.backoff * 2 ** attempt
                if pause >= self._left():   # no time left to wait and try again
                    raise LLMError(f"LLM request to {self.base_url} failed: {type(err).__name__}: {err}; no time "
                                   f"left for a retry within the proposal's deadline of {self._deadline_s:g} s") from err
                if self.on_wait:   # a retry is said, not only counted
                    self.on_wait(f"LLM request to {self.base_url} failed ({type(err).__name__}); retry {attempt + 1} "
                                 f"of {self.max_retries} in {pause:.1f} s")
                time.sleep(pause)
        else:  # pragma: no cover - the loop always breaks or raises
            raise LLMError(f"LLM request failed: {last}")
        if not response.choices:
            raise LLMError("LLM server returned no choices")
        text = response.choices[0].message.content or ""
        usage = response.usage
        prompt = usage.prompt_tokens if usage else sum(estimate_tokens(m["content"]) for m in messages)
        completion = usage.completion_tokens if usage else estimate_tokens(text)
        return self._after(Completion(text, int(prompt), int(completion)))


class LocalClient(_Accounting):
    """Generates with transformers on a local model (by default the embedded SmolLM2-135M-Instruct).

    The model loads on first use. Greedy when ``temperature`` is 0 (or ``greedy=True``), sampled
    otherwise; token counts are exact (tokenizer ids). ``threads`` sets torch's CPU threads while
    generating (restored afterwards): on a busy CPU, one thread avoids the oversubscription that
    makes multi-threaded decoding many times slower.
    """

    def __init__(self, spec: str = "smollm2-135m", dtype: str = "float32", device: str | None = None,
                 greedy: bool = False, seed: int = 0, budget: TokenBudget | None = None,
                 model: Any = None, tokenizer: Any = None, threads: int | None = None) -> None:
        self.spec = spec
        self.dtype = dtype
        self.device = device
        self.greedy = greedy
        self.seed = seed
        self.threads = threads
        self._model, self._tokenizer = model, tokenizer
        self._schema_constraint: Any = None   # llguidance's view of the tokenizer, built on first use
        self._init_accounting(budget)

    def _load(self) -> tuple[Any, Any]:
        if self._model is None:
            # The local model (and torch) load on the first call, not when operators are built
            from evotrainer.policy.base_model import load_base_model

            self._model, self._tokenizer = load_base_model(self.spec, dtype=self.dtype, device=self.device)
        return self._model, self._tokenizer

    def complete(self, messages: list[Message], max_tokens: int = 1024, temperature: float = 0.7,
                 json_schema: dict[str, Any] | None = None) -> Completion:
        """With ``json_schema``, decoding is constrained so that the reply is JSON valid under it
        (``operators/constrained.py``); a reply cut off by ``max_tokens`` raises LLMError."""
        import torch

        model, tok = self._load()
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        self._before(messages, max_tokens, prompt_tokens=int(ids["input_ids"].shape[1]))   # the real count
        input_ids = ids["input_ids"].to(model.device)
        attention = ids["attention_mask"].to(model.device)
        sample = temperature > 0 and not self.greedy
        kwargs: dict[str, Any] = {"do_sample": sample, "max_new_tokens": max_tokens,
                                  "pad_token_id": tok.pad_token_id or tok.eos_token_id}
        constraint = self._constraint(tok).processor(json_schema, input_ids.shape[1]) if json_schema else None
        if constraint is not None:
            kwargs["logits_processor"] = [constraint]
        if sample:
            kwargs["temperature"] = temperature
            torch.manual_seed(self.seed + self.calls)   # reproducible, but a new draw each call
        else:
            # Unset sampling defaults from the generation config so greedy decoding does not warn.
            kwargs.update(temperature=None, top_p=None, top_k=None)
        previous = torch.get_num_threads()
        try:
            if self.threads:
                torch.set_num_threads(self.threads)
            with torch.no_grad():
                out = model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
        finally:
            torch.set_num_threads(previous)
        new = out[0, input_ids.shape[1]:]
        text = tok.decode(new, skip_special_tokens=True)
        completion = self._after(Completion(text, int(input_ids.shape[1]), int(new.shape[0])))
        if constraint is not None and not constraint.finish(new.tolist()):
            raise LLMError(f"the constrained reply was cut off at max_tokens={max_tokens} before its JSON was "
                           f"complete: {text[-120:]!r}")
        return completion

    def _constraint(self, tokenizer: Any) -> Any:
        # Imported here: llguidance is only needed for constrained replies, and building its view of the
        # tokenizer takes about a second, so it is built once per client.
        from evotrainer.operators.constrained import SchemaConstraint

        if self._schema_constraint is None:
            self._schema_constraint = SchemaConstraint(tokenizer)
        return self._schema_constraint


def proposal_deadline(client: Any, seconds: float | None) -> contextlib.AbstractContextManager:
    """``client.deadline(seconds)`` for a client that keeps one; a no-op for others (the local model
    generates a bounded ``max_tokens`` and cannot hang on a network)."""
    fn = getattr(client, "deadline", None)
    return fn(seconds) if callable(fn) else contextlib.nullcontext()


def make_client(url: str | None = None, model: str | None = None, budget: TokenBudget | None = None,
                **kwargs: Any) -> LLMClient:
    """The operators' default client: an OpenAI-compatible server when a URL is given (or
    ``EVOTRAINER_LLM_URL`` is set), else the local base model (``EVOTRAINER_LLM_MODEL`` or the
    embedded one)."""
    url = url or os.environ.get("EVOTRAINER_LLM_URL")
    model = model or os.environ.get("EVOTRAINER_LLM_MODEL")
    if url:
        if not model:
            raise ValueError("an LLM server URL needs a model name (--llm-model or EVOTRAINER_LLM_MODEL)")
        return OpenAIClient(url, model, budget=budget, **kwargs)
    return LocalClient(model or "smollm2-135m", budget=budget, **kwargs)
