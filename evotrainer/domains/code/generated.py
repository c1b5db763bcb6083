"""A seeded generator of small function tasks at three difficulty levels.

Sized for a tiny policy. Measured once with the embedded SmolLM2-135M-Instruct, greedy, 128 new
tokens, 20 train tasks of seed 0 per level: level 1 passes all visible tests on 19/20 (hidden 19/20,
format 20/20), level 2 on 6/20 (hidden 6/20), level 3 on 6/20 (hidden 6/20)
(``benchmarks/code_levels.py``; before the constant-answer fix below, level 2 read 10/20 and 8/20):
level 1 is a guaranteed signal, levels 2 and 3 room to learn.

1. one expression of the argument(s), parameterised by a constant k ("return x plus 7")
2. one loop or builtin over a list or string ("count the elements of nums greater than 4")
3. a small algorithm (digit sums, primes, de-duplication, running sums, ...)

Expected outputs come from a reference implementation inside the engine, on seeded random inputs;
two are visible (in the prompt), five hidden. The visible tests, and the hidden tests, each expect at
least two different values (by ``==``), and threshold tasks draw inputs around their threshold: a
task whose every test expects the same value is solved by ``return 0``. Tasks are distinct by their
description, and ``make_splits`` cuts one pool of distinct tasks into disjoint train/heldout/test splits.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from evotrainer.domains.code.tasks import function_task
from evotrainer.domains.task import SPLITS, Task, text_key

LEVELS = (1, 2, 3)
N_VISIBLE, N_HIDDEN = 2, 5

Gen = Callable[[random.Random], tuple]


def _ints(lo: int, hi: int) -> Gen:
    return lambda r: (r.randint(lo, hi),)


def _pair(lo: int, hi: int) -> Gen:
    return lambda r: (r.randint(lo, hi), r.randint(lo, hi))


def _nums(r: random.Random) -> tuple:
    return ([r.randint(-9, 20) for _ in range(r.randint(0, 7))],)


def _nums_near(k: int) -> Gen:
    """Lists around a threshold k: some elements above it, some not (inputs that never cross k would
    make every expected value the same, and ``return 0`` a solution)."""
    return lambda r: ([r.randint(k - 15, k + 15) for _ in range(r.randint(1, 7))],)


def _nums_to(k: int) -> Gen:
    """Lists of which about half the elements are multiples of k."""
    return lambda r: ([r.randint(-9, 3 * k) if r.random() < 0.5 else k * r.randint(-2, 3)
                       for _ in range(r.randint(1, 7))],)


def _multiple_or_not(k: int) -> Gen:
    """Half multiples of k, half not (uniform inputs would make a large k's answers all False)."""
    return lambda r: (k * r.randint(0, 6) + (0 if r.random() < 0.5 else r.randint(1, k - 1)),)


def _ints_near(k: int) -> Gen:
    return lambda r: (r.randint(k - 25, k + 25),)


def _word(r: random.Random) -> tuple:
    return ("".join(r.choice("abcdeilnorst") for _ in range(r.randint(1, 8))),)


def _short(r: random.Random) -> tuple:
    return ("".join(r.choice("abcxyz") for _ in range(r.randint(1, 3))),)


def _sentence(r: random.Random) -> tuple:
    return (" ".join(_word(r)[0] for _ in range(r.randint(1, 5))),)


@dataclass(frozen=True)
class Template:
    name: str            # function name; "{k}" is filled with the constant
    params: str          # parameter list
    text: str            # what the function returns, one sentence
    ref: str             # reference body (an expression or statements) using k
    inputs: Gen | Callable[[Any], Gen]   # a generator, or (with k_inputs) a function of k giving one
    ks: tuple = (None,)  # constants that make distinct tasks
    k_inputs: bool = False


_K = tuple(range(2, 41))
TEMPLATES: dict[int, list[Template]] = {
    1: [Template("add_{k}", "x", "Return x plus {k}.", "return x + {k}", _ints(-50, 50), _K),
        Template("times_{k}", "x", "Return x multiplied by {k}.", "return x * {k}", _ints(-30, 30), _K),
        Template("minus_{k}", "x", "Return x minus {k}.", "return x - {k}", _ints(-50, 50), _K),
        Template("mod_{k}", "x", "Return the remainder of x divided by {k}.", "return x % {k}", _ints(0, 200), _K),
        Template("divisible_by_{k}", "x", "Return True if x is divisible by {k}, otherwise False.",
                 "return x % {k} == 0", _multiple_or_not, _K, k_inputs=True),
        Template("repeat_{k}", "s", "Return the string s repeated {k} times.", "return s * {k}", _short, tuple(range(2, 10))),
        Template("greater_than_{k}", "x", "Return True if x is greater than {k}, otherwise False.",
                 "return x > {k}", _ints_near, _K, k_inputs=True),
        Template("add", "a, b", "Return the sum of a and b.", "return a + b", _pair(-99, 99)),
        Template("larger", "a, b", "Return the larger of a and b.", "return max(a, b)", _pair(-99, 99)),
        Template("square", "x", "Return x squared.", "return x * x", _ints(-30, 30)),
        Template("is_even", "n", "Return True if n is even, otherwise False.", "return n % 2 == 0", _ints(-50, 50)),
        Template("absolute", "x", "Return the absolute value of x.", "return abs(x)", _ints(-99, 99))],
    2: [Template("count_above_{k}", "nums", "Return how many elements of the list nums are greater than {k}.",
                 "return sum(1 for v in nums if v > {k})", _nums_near, _K, k_inputs=True),
        Template("sum_above_{k}", "nums", "Return the sum of the elements of the list nums that are greater than {k}.",
                 "return sum(v for v in nums if v > {k})", _nums_near, _K, k_inputs=True),
        Template("scale_{k}", "nums", "Return a new list with every element of nums multiplied by {k}.",
                 "return [v * {k} for v in nums]", _nums, _K),
        Template("multiples_of_{k}", "nums", "Return a list of the elements of nums that are divisible by {k}, in order.",
                 "return [v for v in nums if v % {k} == 0]", _nums_to, _K, k_inputs=True),
        Template("pad_{k}", "s", "Return s followed by {k} exclamation marks.", "return s + '!' * {k}", _word, _K),
        Template("sum_list", "nums", "Return the sum of the elements of the list nums.", "return sum(nums)", _nums),
        Template("reverse_string", "s", "Return the string s reversed.", "return s[::-1]", _word),
        Template("count_vowels", "s", "Return the number of vowels (a, e, i, o, u) in the string s.",
                 "return sum(c in 'aeiou' for c in s)", _word),
        Template("count_even", "nums", "Return how many elements of the list nums are even.",
                 "return sum(v % 2 == 0 for v in nums)", _nums),
        Template("to_upper", "s", "Return the string s in upper case.", "return s.upper()", _word)],
    3: [Template("digit_sum", "n", "Return the sum of the decimal digits of the non-negative integer n.",
                 "return sum(int(c) for c in str(n))", _ints(0, 10 ** 6)),
        Template("is_prime", "n", "Return True if n is a prime number, otherwise False.",
                 "return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))", _ints(0, 200)),
        Template("dedupe", "nums", "Return the list nums without repeated values, keeping the first occurrence of each.",
                 "return list(dict.fromkeys(nums))", _nums),
        Template("running_sum", "nums", "Return the list of running sums of nums (the i-th item is nums[0] + ... + nums[i]).",
                 "out, t = [], 0\n    for v in nums:\n        t += v\n        out.append(t)\n    return out", _nums),
        Template("factorial", "n", "Return n factorial (0 factorial is 1).",
                 "out = 1\n    for i in range(2, n + 1):\n        out *= i\n    return out", _ints(0, 12)),
        Template("word_count", "s", "Return the number of words in the string s (words are separated by spaces).",
                 "return len(s.split())", _sentence),
        Template("first_multiples_{k}", "n", "Return the list of the first n positive multiples of {k}.",
                 "return [{k} * i for i in range(1, n + 1)]", _ints(0, 8), _K),
        Template("fib", "n", "Return the n-th Fibonacci number, where fib(0) = 0 and fib(1) = 1.",
                 "a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a", _ints(0, 25)),
        Template("capitalize_words", "s", "Return s with the first letter of every word in upper case.",
                 "return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))", _sentence)],
}


def _build(t: Template, k: Any, level: int, rng: random.Random) -> dict:
    fill = (lambda s: s.format(k=k)) if k is not None else (lambda s: s)
    name, text = fill(t.name), fill(t.text)
    reference = f"def {name}({t.params}):\n    {fill(t.ref)}\n"
    ns: dict[str, Any] = {}
    exec(reference, ns)  # engine-written reference code, not policy code
    fn, seen, tests, values = ns[name], set(), [], []
    gen = t.inputs(k) if t.k_inputs else t.inputs
    for _ in range(400):
        args = gen(rng)
        if repr(args) in seen:
            continue
        value = fn(*args)
        # The last visible and the last hidden test must differ from the others of their group: one
        # answer (by ==, so 0 and False are one) for every test of a group would let a constant pass.
        group = values[:N_VISIBLE] if len(tests) < N_VISIBLE else values[N_VISIBLE:]
        last = len(tests) in (N_VISIBLE - 1, N_VISIBLE + N_HIDDEN - 1)
        if last and all(v == value for v in group):
            continue
        seen.add(repr(args))
        shown = ", ".join(repr(a) for a in args)
        tests.append(f"assert candidate({shown}) == {value!r}")
        values.append(value)
        if len(tests) == N_VISIBLE + N_HIDDEN:
            break
    header = f'def {name}({t.params}):\n    """{text}"""\n'
    return {"name": name, "header": header, "tests": tests, "reference": reference, "level": level, "text": text}


def level_space(level: int) -> list[tuple[Template, Any]]:
    """Every distinct (template, constant) of one level."""
    if level not in LEVELS:
        raise ValueError(f"code difficulty for generated tasks must be one of {LEVELS}, got {level!r}")
    return [(t, k) for t in TEMPLATES[level] for k in t.ks]


def _draw(n: int, levels: Sequence[int], seed: int) -> list[dict]:
    """n distinct problems, levels round-robin; own RNG per (seed, level)."""
    streams = {}
    for lvl in dict.fromkeys(levels):
        space = level_space(lvl)
        random.Random(f"evotrainer-code-{seed}-{lvl}").shuffle(space)
        streams[lvl] = (iter(space), random.Random(f"evotrainer-code-inputs-{seed}-{lvl}"), len(space))
    out = []
    for i in range(n):
        lvl = levels[i % len(levels)]
        it, rng, size = streams[lvl]
        try:
            t, k = next(it)
        except StopIteration:
            raise ValueError(f"generated code difficulty {lvl} has only {size} distinct tasks; "
                             f"ask for fewer tasks or mix in other levels") from None
        out.append(_build(t, k, lvl, rng))
    return out


def _to_task(p: dict, split: str, index: int) -> Task:
    tid = f"code-{split}-{p['level']}-{index}-{text_key(p['header'])[:6]}"
    return function_task(tid, split, p["level"], p["name"], p["header"], p["tests"][:N_VISIBLE],
                         p["tests"][N_VISIBLE:], p["reference"], intro="Write the following Python function.")


def make_splits(n_train: int, n_heldout: int, n_test: int, levels: Sequence[int], seed: int) -> dict[str, list[Task]]:
    """Disjoint splits from one pool (cut test first, then heldout, then train, so the evaluation
    sets stay put when only the training budget changes)."""
    sizes = {"test": n_test, "heldout": n_heldout, "train": n_train}
    pool = _draw(sum(sizes.values()), list(levels), seed)
    out, start = {}, 0
    for split, k in sizes.items():
        out[split] = [_to_task(p, split, i) for i, p in enumerate(pool[start:start + k])]
        start += k
    return {s: out[s] for s in SPLITS}
