"""Seeded generator of arithmetic word problems at five difficulty levels.

The levels are sized for a tiny policy (SmolLM2-135M gets 1-digit addition ~92%, 2-digit ~22%,
a one-step word problem ~18%, a two-step one ~2%), so the low levels give a learnable signal and the
high ones leave room for a curriculum:

1. one-digit addition, bare expression          ("What is 3 + 5?")
2. two-digit addition or subtraction, bare       ("What is 47 - 18?")
3. one-step word problem                         (a + b or a - b)
4. two-step word problem                         (a + b - c)
5. three-step word problem mixing +, - and a small x

Every task stores its arithmetic in ``hidden`` (``expression``, ``operands``, ``template``) so that
answers can be recomputed independently, and the answer in both ``Task.answer`` and
``hidden["answer"]``. ``make_splits`` draws one pool of distinct problems and cuts it into
train/heldout/test, so the splits are disjoint by construction.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

from evotrainer.domains.task import SPLITS, Task, text_key

DOMAIN = "math"
LEVELS = (1, 2, 3, 4, 5)

# Every generated prompt ends with this line; the verifier's "Answer:" rule matches it.
ANSWER_INSTRUCTION = "Give the final answer as a number after 'Answer:'."
# A planted leak looks like an innocent field of the problem (like a fix left in git history).
LEAK_TEMPLATE = "(Reference note: {answer})"
LEAK_NOTE = re.compile(r"\(Reference note:\s*([^)]*)\)")   # what LEAK_TEMPLATE writes, read back


def leaked_answer(text: str) -> str | None:
    """The answer a planted note in ``text`` gives away, or None when the text carries none."""
    m = LEAK_NOTE.search(text)
    return m.group(1).strip() if m else None

NAMES = ("Ava", "Ben", "Carla", "Dev", "Emma", "Finn", "Grace", "Hugo", "Iris", "Jack", "Lena",
         "Max", "Nora", "Omar", "Priya", "Sam", "Tara", "Yusuf", "Zoe", "Leo")
OBJECTS = ("apples", "marbles", "stickers", "books", "pencils", "cookies", "cards", "stamps",
           "shells", "balloons", "coins", "crayons", "buttons", "oranges")

# Word templates per level: (name, text, expression over a..e). The expression is evaluated with
# Python precedence and stored in hidden, so tests can recompute the answer from the operands.
_WORD_TEMPLATES: dict[int, tuple[tuple[str, str, str], ...]] = {
    3: (
        ("buy_more", "{n1} has {a} {obj}. {n1} buys {b} more. How many {obj} does {n1} have now?",
         "a + b"),
        ("pick_total", ("{n1} picked {a} {obj} in the morning and {b} in the afternoon. "
          "How many {obj} did {n1} pick in total?"), "a + b"),
        ("basket_add", ("There are {a} {obj} in a basket. {n1} puts in {b} more. "
          "How many {obj} are in the basket now?"), "a + b"),
        ("give_away", ("{n1} had {a} {obj} and gave {b} of them to {n2}. "
          "How many {obj} does {n1} have left?"), "a - b"),
        ("shelf_take", ("A shelf holds {a} {obj}. {n1} takes {b} of them. "
          "How many {obj} are left on the shelf?"), "a - b"),
    ),
    4: (
        ("buy_then_give", ("{n1} has {a} {obj}. {n1} buys {b} more and then gives {c} to {n2}. "
          "How many {obj} does {n1} have now?"), "a + b - c"),
        ("box_add_remove", ("A box has {a} {obj}. {n1} adds {b} {obj} and later removes {c}. "
          "How many {obj} are in the box now?"), "a + b - c"),
        ("collect_lose", ("{n1} collected {a} {obj} on Monday and {b} on Tuesday, then lost {c}. "
          "How many {obj} does {n1} have left?"), "a + b - c"),
        ("table_bring_take", ("There were {a} {obj} on the table. {n1} brought {b} more, and {n2} "
          "took {c} away. How many {obj} are on the table now?"), "a + b - c"),
    ),
    5: (
        ("packs_give_find", ("{n1} buys {a} packs of {obj} with {b} {obj} in each pack. {n1} gives "
          "{c} to {n2} and then finds {d} more. How many {obj} does {n1} have now?"),
         "a * b - c + d"),
        ("bags_give", ("{n1} has {a} {obj}. {n1} buys {b} bags with {c} {obj} in each bag, then "
          "gives away {d}. How many {obj} does {n1} have now?"), "a + b * c - d"),
        ("tables_add_take", ("A classroom has {a} tables with {b} {obj} on each table. The teacher "
          "adds {c} more {obj} and {n1} takes {d}. How many {obj} are in the classroom now?"),
         "a * b + c - d"),
        ("use_then_boxes", ("{n1} had {a} {obj} and used {b} of them. Then {n1} bought {c} boxes "
          "with {d} {obj} in each box. How many {obj} does {n1} have now?"), "a - b + c * d"),
    ),
}
# Template family per level (tests check that each level produces only its own family).
TEMPLATE_FAMILIES: dict[int, tuple[str, ...]] = {
    1: ("bare_add",), 2: ("bare_add", "bare_sub"),
    **{lvl: tuple(t[0] for t in ts) for lvl, ts in _WORD_TEMPLATES.items()},
}


def _operands(level: int, expr: str, rng: random.Random) -> dict[str, int]:
    """Operands for a word template; ranges keep intermediate and final results non-negative."""
    if level == 3:
        a = rng.randint(2, 20)
        b = rng.randint(1, a - 1) if "-" in expr else rng.randint(1, 20)
        return {"a": a, "b": b}
    if level == 4:
        a, b = rng.randint(2, 30), rng.randint(1, 20)
        return {"a": a, "b": b, "c": rng.randint(1, a + b - 1)}
    # Level 5: a small multiplication (factors 2..6) plus two +/- steps, result >= 1.
    small = lambda: rng.randint(2, 6)
    if expr == "a * b - c + d":
        a, b = small(), small()
        return {"a": a, "b": b, "c": rng.randint(1, a * b - 1), "d": rng.randint(1, 15)}
    if expr == "a + b * c - d":
        a, b, c = rng.randint(1, 20), small(), small()
        return {"a": a, "b": b, "c": c, "d": rng.randint(1, a + b * c - 1)}
    if expr == "a * b + c - d":
        a, b, c = small(), small(), rng.randint(1, 15)
        return {"a": a, "b": b, "c": c, "d": rng.randint(1, a * b + c - 1)}
    a = rng.randint(3, 25)  # "a - b + c * d"
    return {"a": a, "b": rng.randint(1, a - 1), "c": small(), "d": small()}


def _problem(level: int, op: tuple[int, str, int] | None, rng: random.Random) -> dict:
    """One problem as a record: question text, expression, operands, template, answer."""
    if level in (1, 2):
        assert op is not None
        a, sign, b = op
        expr = f"{a} {sign} {b}"
        return {"question": f"What is {expr}?", "expression": expr, "operands": [a, b],
                "template": "bare_add" if sign == "+" else "bare_sub", "answer": eval(expr)}
    name, text, expr = rng.choice(_WORD_TEMPLATES[level])
    vals = _operands(level, expr, rng)
    n1, n2 = rng.sample(NAMES, 2)
    question = text.format(n1=n1, n2=n2, obj=rng.choice(OBJECTS), **vals)
    concrete = "".join(str(vals[ch]) if ch in vals else ch for ch in expr)
    # eval of a template we wrote, over integers we drew: safe.
    return {"question": question, "expression": concrete, "operands": list(vals.values()),
            "template": name, "answer": eval(concrete)}


def _bare_space(level: int) -> list[tuple[int, str, int]]:
    """All bare expressions of a level, enumerated so the small level-1 space is used exactly."""
    if level == 1:
        return [(a, "+", b) for a in range(10) for b in range(10)]
    return ([(a, "+", b) for a in range(10, 100) for b in range(10, 100)]
            + [(a, "-", b) for a in range(10, 100) for b in range(10, a + 1)])


def level_capacity(level: int) -> int | None:
    """Number of distinct problems a bare level can produce (None: large, sampled)."""
    _check_level(level)
    return len(_bare_space(level)) if level in (1, 2) else None


def _check_level(level: int) -> None:
    if level not in LEVELS:
        raise ValueError(f"math difficulty must be one of {LEVELS}, got {level!r}")


def _level_stream(level: int, seed: int) -> Callable[[], dict]:
    """A deterministic source of distinct problems of one level (own RNG per (seed, level), so
    adding a level to a mix does not change the problems drawn for the others)."""
    rng = random.Random(f"evotrainer-math-{seed}-{level}")
    if level in (1, 2):
        space = _bare_space(level)
        rng.shuffle(space)
        it = iter(space)

        def next_bare() -> dict:
            try:
                return _problem(level, next(it), rng)
            except StopIteration:
                raise ValueError(
                    f"math difficulty {level} has only {len(space)} distinct problems; "
                    f"ask for fewer tasks or mix in other levels") from None
        return next_bare

    seen: set[str] = set()

    def next_word() -> dict:
        # Rejection sampling with a budget, so an exhausted space fails loudly instead of looping.
        for _ in range(5000):
            p = _problem(level, None, rng)
            key = text_key(p["question"])
            if key not in seen:
                seen.add(key)
                return p
        raise ValueError(f"math difficulty {level} cannot produce more than {len(seen)} "
                         f"distinct problems for seed {seed}")
    return next_word


def _levels(difficulty: int | Sequence[int]) -> list[int]:
    levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
    if not levels:
        raise ValueError("difficulty must be a level or a non-empty list of levels")
    for lvl in levels:
        _check_level(lvl)
    return levels


def _draw(n: int, levels: list[int], seed: int) -> list[dict]:
    """n distinct problems, levels assigned round-robin (exact proportions, deterministic)."""
    for lvl in dict.fromkeys(levels):    # say what was asked before drawing any of it
        need = sum(1 for i in range(n) if levels[i % len(levels)] == lvl)
        cap = level_capacity(lvl)
        if cap is not None and need > cap:
            raise ValueError(f"math difficulty {lvl} has only {cap} distinct problems, but {n} tasks over "
                             f"levels {levels} take {need} of them; ask for at most "
                             f"{_largest_n(cap, lvl, levels)} tasks in all, or mix in other levels")
    streams = {lvl: _level_stream(lvl, seed) for lvl in dict.fromkeys(levels)}
    out = []
    for i in range(n):
        lvl = levels[i % len(levels)]
        out.append({**streams[lvl](), "level": lvl})
    return out


def _largest_n(cap: int, lvl: int, levels: list[int]) -> int:
    """The most tasks round-robin over ``levels`` can draw before level ``lvl`` runs out."""
    full, rest = divmod(cap, levels.count(lvl))
    n = full * len(levels)
    for i in range(len(levels)):             # then the start of one more cycle, up to the next lvl
        if levels[i] == lvl:
            if rest == 0:
                return n + i
            rest -= 1
    return n + len(levels)


def _to_task(p: dict, split: str, index: int) -> Task:
    answer = str(p["answer"])
    prompt = f"{p['question']}\n{ANSWER_INSTRUCTION}"
    hidden = {"answer": answer, "expression": p["expression"], "operands": p["operands"],
              "template": p["template"], "question": p["question"], "leaked": False}
    # Index keeps ids unique within a split; the content hash keeps them unique across seeds.
    tid = f"math-{split}-{p['level']}-{index}-{text_key(p['question'])[:6]}"
    return Task(id=tid, prompt=prompt, answer=answer, split=split, domain=DOMAIN,
                difficulty=p["level"], hidden=hidden)


def generate_tasks(n: int, split: str, difficulty: int | Sequence[int], seed: int) -> list[Task]:
    """n distinct generated tasks of one split (deterministic for a seed)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [_to_task(p, split, i) for i, p in enumerate(_draw(n, _levels(difficulty), seed))]


def make_splits(n_train: int, n_heldout: int, n_test: int, difficulty: int | Sequence[int],
                seed: int, leak_share: float = 0.0) -> dict[str, list[Task]]:
    """Disjoint train/heldout/test splits drawn from one pool of distinct problems.

    The pool is cut test first, then heldout, then train, so the evaluation sets stay the same when
    only the training budget changes. ``leak_share`` plants the answer in that share of TRAIN tasks
    (see ``plant_leak``); held-out and test tasks never carry it.
    """
    sizes = {"test": n_test, "heldout": n_heldout, "train": n_train}
    for split, k in sizes.items():
        if k < 0:
            raise ValueError(f"n_{split} must be >= 0, got {k}")
    pool = _draw(sum(sizes.values()), _levels(difficulty), seed)
    out: dict[str, list[Task]] = {}
    start = 0
    for split, k in sizes.items():
        out[split] = [_to_task(p, split, i) for i, p in enumerate(pool[start:start + k])]
        start += k
    out["train"] = plant_leak(out["train"], leak_share, seed)
    return {s: out[s] for s in SPLITS}


def plant_leak(tasks: list[Task], share: float, seed: int) -> list[Task]:
    """Copies of ``tasks`` where round(share * len) of them carry their answer in the prompt and
    in ``visible["leak"]`` (a planted shortcut that validity checks must catch).

    The note is inserted before the instruction line so prompts still end with the instruction.
    ``hidden["leaked"]`` records which tasks carry it, for tests and validity scoring.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"leak_share must be in [0, 1], got {share}")
    k = round(share * len(tasks))
    if k == 0:
        return list(tasks)
    chosen = set(random.Random(f"evotrainer-leak-{seed}").sample(range(len(tasks)), k))
    out = []
    for i, t in enumerate(tasks):
        if i not in chosen:
            out.append(t)
            continue
        note = LEAK_TEMPLATE.format(answer=t.answer)
        body, sep, last = t.prompt.rpartition("\n")
        prompt = f"{body} {note}{sep}{last}" if sep else f"{t.prompt} {note}"
        out.append(Task(id=t.id, prompt=prompt, answer=t.answer, split=t.split, domain=t.domain,
                        difficulty=t.difficulty, hidden={**t.hidden, "leaked": True},
                        visible={**t.visible, "leak": t.answer}))
    return out
