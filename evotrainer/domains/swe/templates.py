"""Module templates the repository generator builds packages from (correct code plus test inputs).

Each template is one self-contained module (it imports nothing, so a bug stays inside it) whose
public functions call private helpers, so a bug can sit "one call away" from the failing function.
Code is plain on purpose: no ``while`` loops and no recursion, so no injected bug can hang the
engine while the generator checks it. ``cases`` are argument lists for each public function; the
expected values come from running the correct code, never from hand-written answers. The eight
templates here are joined by those of ``templates_numbers`` and ``templates_records`` (more modules:
more distinct bugs per level and split, so an evaluation split need not repeat one).
"""

from __future__ import annotations

from evotrainer.domains.swe.templates_numbers import NUMBER_TEMPLATES
from evotrainer.domains.swe.templates_records import RECORD_TEMPLATES

_ITEMS = [["apple", 3], ["pear", 0], ["fig", 7]]

TEMPLATES: dict[str, dict] = {
    "stats": {
        "source": '''"""Small statistics helpers."""


def _total(values):
    result = 0
    for v in values:
        result = result + v
    return result


def mean(values):
    if len(values) == 0:
        return 0.0
    return _total(values) / len(values)


def clamp(x, low=0, high=10):
    if x < low:
        return low
    if x > high:
        return high
    return x


def running_max(values):
    out = []
    best = None
    for v in values:
        if best is None or v > best:
            best = v
        out.append(best)
    return out


def _scale_one(v, factor):
    return v * factor


def scaled(values, factor=2):
    return [_scale_one(v, factor) for v in values]
''',
        "cases": {
            "mean": [[[1, 2, 3]], [[4, 4, 10]], [[]], [[-2, 2, 5, 7]]],
            "clamp": [[5], [-3], [12], [10], [0], [7, 2, 6]],
            "running_max": [[[1, 3, 2, 5]], [[5, 4, 3]], [[]], [[2, 2, 7]]],
            "scaled": [[[1, 2, 3]], [[0, -1]], [[2, 5], 3]],
        },
    },
    "text": {
        "source": '''"""Text utilities."""


def _normalize(word):
    return word.strip().lower()


def count_words(text):
    counts = {}
    for word in text.split():
        key = _normalize(word)
        counts[key] = counts.get(key, 0) + 1
    return counts


def truncate(text, limit=10, suffix="..."):
    if len(text) <= limit:
        return text
    return text[:limit - len(suffix)] + suffix


def pad_left(text, width, fill=" "):
    missing = width - len(text)
    if missing > 0:
        return fill * missing + text
    return text


def initials(name):
    parts = [_normalize(p) for p in name.split()]
    return "".join(p[0].upper() for p in parts if p)
''',
        "cases": {
            "count_words": [["a b a"], ["The the THE cat"], [""], ["x y z x"]],
            "truncate": [["hello"], ["hello world, again"], ["abcdefghij"], ["abcdefghijk", 6], ["short", 4, "!"]],
            "pad_left": [["7", 3], ["abc", 2], ["ab", 5, "*"], ["", 1, "0"]],
            "initials": [["ada lovelace"], ["Grace Brewster Hopper"], [""], ["alan"]],
        },
    },
    "chunks": {
        "source": '''"""Sequence slicing helpers."""


def _window(values, start, size):
    return values[start:start + size]


def chunks(values, size):
    out = []
    for start in range(0, len(values), size):
        out.append(_window(values, start, size))
    return out


def moving_sum(values, size):
    sums = []
    for start in range(len(values) - size + 1):
        sums.append(sum(_window(values, start, size)))
    return sums


def last_n(values, n=3):
    if n <= 0:
        return []
    return values[-n:]


def index_of(values, target):
    for i in range(len(values)):
        if values[i] == target:
            return i
    return -1
''',
        "cases": {
            "chunks": [[[1, 2, 3, 4, 5], 2], [[1, 2, 3], 3], [[], 4], [[1, 2, 3, 4], 1]],
            "moving_sum": [[[1, 2, 3, 4], 2], [[5, 5, 5], 3], [[1, 2], 3], [[2, 4, 6, 8, 10], 2]],
            "last_n": [[[1, 2, 3, 4, 5]], [[1, 2, 3], 1], [[1, 2], 0], [[9, 8, 7, 6], 2]],
            "index_of": [[[4, 5, 6], 6], [[4, 5, 6], 4], [[1, 2], 9], [[3, 3], 3]],
        },
    },
    "money": {
        "source": '''"""Prices, taxes and bills (amounts in cents are integers)."""


def _apply_rate(amount, rate):
    return amount * (1 + rate)


def with_tax(amount, rate=0.25):
    return round(_apply_rate(amount, rate), 2)


def discount(amount, percent):
    if percent > 100:
        percent = 100
    return round(amount - amount * percent / 100, 2)


def split_bill(total, people):
    share = total // people
    remainder = total - share * people
    return [share + 1 if i < remainder else share for i in range(people)]


def _line_price(qty, price, fee):
    return qty * price + fee


def total_price(items, fee=0):
    return round(sum(_line_price(qty, price, fee) for qty, price in items), 2)
''',
        "cases": {
            "with_tax": [[100], [40, 0.5], [0], [8]],
            "discount": [[200, 10], [50, 150], [80, 0], [99, 50]],
            "split_bill": [[10, 3], [9, 3], [7, 2], [5, 1]],
            "total_price": [[[[2, 3], [1, 4]]], [[]], [[[3, 2]], 1], [[[1, 5], [2, 1]], 2]],
        },
    },
    "grid": {
        "source": '''"""Points, boxes and grids."""


def _span(low, high):
    return high - low


def box_size(box):
    return [_span(box[0], box[2]), _span(box[1], box[3])]


def bounding_box(points):
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    return [min(xs), min(ys), max(xs), max(ys)]


def inside(point, box):
    x, y = point
    return box[0] <= x <= box[2] and box[1] <= y <= box[3]


def _cell(row, col, width):
    return row * width + col


def cell_index(row, col, width=4):
    if col >= width:
        return -1
    return _cell(row, col, width)
''',
        "cases": {
            "box_size": [[[0, 0, 3, 2]], [[1, 1, 1, 5]], [[-2, 0, 2, 9]]],
            "bounding_box": [[[[1, 2], [3, 0], [2, 5]]], [[[0, 0]]], [[[-1, 4], [6, -2]]]],
            "inside": [[[1, 1], [0, 0, 2, 2]], [[3, 1], [0, 0, 2, 2]], [[2, 2], [0, 0, 2, 2]], [[0, 5], [0, 0, 9, 4]]],
            "cell_index": [[0, 0], [1, 2], [2, 3, 5], [0, 4], [3, 1, 2]],
        },
    },
    "inventory": {
        "source": '''"""Stock levels: items are [name, units] pairs."""


def _stock(items, name):
    for item in items:
        if item[0] == name:
            return item[1]
    return 0


def in_stock(items, name):
    return _stock(items, name) > 0


def restock(items, name, amount=5):
    out = []
    for item in items:
        if item[0] == name:
            out.append([item[0], item[1] + amount])
        else:
            out.append(list(item))
    return out


def total_units(items):
    return sum(item[1] for item in items)


def low_stock(items, threshold=3):
    return [item[0] for item in items if _stock(items, item[0]) < threshold]
''',
        "cases": {
            "in_stock": [[_ITEMS, "apple"], [_ITEMS, "pear"], [_ITEMS, "kiwi"], [_ITEMS, "fig"]],
            "restock": [[_ITEMS, "pear"], [_ITEMS, "fig", 2], [[], "x"]],
            "total_units": [[_ITEMS], [[]], [[["a", 1]]]],
            "low_stock": [[_ITEMS], [_ITEMS, 8], [[], 2], [[["a", 3]]]],
        },
    },
    "scores": {
        "source": '''"""Exam scores and grades."""


def _percent(part, whole):
    if whole == 0:
        return 0.0
    return round(100 * part / whole, 1)


def grade(score, total=100):
    p = _percent(score, total)
    if p >= 90:
        return "A"
    if p >= 75:
        return "B"
    if p >= 50:
        return "C"
    return "F"


def pass_rate(scores, cutoff=50):
    passed = [s for s in scores if s >= cutoff]
    return _percent(len(passed), len(scores))


def top_k(scores, k=2):
    return sorted(scores, reverse=True)[:k]


def _spread(values):
    return max(values) - min(values)


def spread(scores):
    if len(scores) < 2:
        return 0
    return _spread(scores)
''',
        "cases": {
            "grade": [[95], [80], [60], [10], [45, 50], [9, 10]],
            "pass_rate": [[[40, 60, 80]], [[]], [[50, 49]], [[30, 70], 70]],
            "top_k": [[[3, 9, 1, 7]], [[5]], [[4, 8, 6], 1], [[1, 2, 3], 3]],
            "spread": [[[3, 9, 1]], [[5]], [[2, 2, 4]]],
        },
    },
    "timefmt": {
        "source": '''"""Clock times and durations."""


def _two(n):
    if n < 10:
        return "0" + str(n)
    return str(n)


def clock(minutes):
    hours = minutes // 60 % 24
    return _two(hours) + ":" + _two(minutes % 60)


def duration(seconds):
    mins = seconds // 60
    secs = seconds - mins * 60
    return str(mins) + "m" + _two(secs) + "s"


def add_minutes(hhmm, delta=30):
    h, m = hhmm.split(":")
    return clock(int(h) * 60 + int(m) + delta)


def _is_leap(year):
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_year(year):
    if _is_leap(year):
        return 366
    return 365
''',
        "cases": {
            "clock": [[0], [75], [1439], [1500], [9]],
            "duration": [[125], [59], [3600], [61]],
            "add_minutes": [["10:15"], ["23:45"], ["00:00", 5], ["09:50", 20]],
            "days_in_year": [[2024], [2023], [1900], [2000]],
        },
    },
    **NUMBER_TEMPLATES,
    **RECORD_TEMPLATES,
}

PACKAGES = ("tidykit", "ledgerly", "shapeworks", "wordsmithy", "numbox", "brickyard", "plumline", "quarkutils")
