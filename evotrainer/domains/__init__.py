"""Task domains: task sources and verifiers (math and code; swe registers here too).

``get_domain("math", n_train=..., ...)`` builds a domain by name. Domains are imported lazily so
that importing this package stays cheap (the math verifier pulls in sympy on first use).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from evotrainer.domains.base import Domain
from evotrainer.domains.task import SPLITS, Task, text_key

# name -> "module:attribute" (lazy) or a factory registered at runtime.
_REGISTRY: dict[str, str | Callable[..., Domain]] = {
    "math": "evotrainer.domains.math.domain:MathDomain",
    "code": "evotrainer.domains.code.domain:CodeDomain",
    "swe": "evotrainer.domains.swe.domain:SWEDomain",
}


def register_domain(name: str, factory: str | Callable[..., Domain]) -> None:
    """Makes ``get_domain(name)`` build domains with ``factory`` ("module:attr" or a callable)."""
    _REGISTRY[name] = factory


def known_domains() -> list[str]:
    return sorted(_REGISTRY)


def get_domain(name: str, **kwargs: Any) -> Domain:
    """A domain by registered name, built with ``kwargs``; unknown names list the known ones."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown domain {name!r}; known domains: {', '.join(known_domains())}")
    factory = _REGISTRY[name]
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
    return factory(**kwargs)


def planted_leak(text: str) -> str | None:
    """The answer a planted leak in a prompt's text gives away (math's reference note, the one
    domain that plants its leak in the prompt; an SWE repository's is its git history), or None.
    The fitness layer's leak checks read prompts through this, not through a marker of their own."""
    from evotrainer.domains.math.tasks import leaked_answer   # no sympy: only the task generator

    return leaked_answer(text)


def build_domain(spec: Any) -> Domain:
    """The domain a ``domain:`` config section describes (any object with its fields)."""
    extra: dict[str, Any] = {}
    if getattr(spec, "episode", None) is not None:   # multi-turn limits (the config refuses them off swe)
        from evotrainer.domains.swe.environment import EnvLimits
        extra["episode_limits"] = EnvLimits(**spec.episode.model_dump())
    return get_domain(spec.name, n_train=spec.n_train, n_heldout=spec.n_heldout, n_test=spec.n_test,
                      difficulty=spec.difficulty, seed=spec.seed, leak_share=spec.leak_share, files=spec.files,
                      **extra)


__all__ = ["SPLITS", "Domain", "Task", "build_domain", "get_domain", "known_domains", "planted_leak", "register_domain",
           "text_key"]
