"""Module templates on numbers and counting (units, sequences, pages, parcels, dates, digits).

Same rules as ``templates``: self-contained, no ``while`` and no recursion, public functions that
call private helpers, and ``cases`` whose expected values come from running the correct code. These
modules are dense in operators, comparisons and integer constants on purpose: each such token in a
public function whose change some case detects is one more level-1 bug.
"""

from __future__ import annotations

NUMBER_TEMPLATES: dict[str, dict] = {
    "units": {
        "source": '''"""Unit conversions."""


def _ratio(value, num, den):
    return value * num / den


def to_fahrenheit(celsius):
    return round(_ratio(celsius, 9, 5) + 32, 1)


def to_celsius(fahrenheit):
    return round((fahrenheit - 32) * 5 / 9, 1)


def feet_inches(inches):
    feet = inches // 12
    rest = inches - feet * 12
    return [feet, rest]


def pace(minutes, km):
    if km <= 0:
        return 0
    return round(minutes / km, 2)
''',
        "cases": {
            "to_fahrenheit": [[0], [100], [-40], [37], [36.6]],
            "to_celsius": [[32], [212], [100], [0], [-40]],
            "feet_inches": [[0], [25], [12], [71], [13]],
            "pace": [[30, 6], [25, 0], [50, 1], [47, 3], [10, -2]],
        },
    },
    "sequences": {
        "source": '''"""Arithmetic sequences and figurate numbers."""


def _gap(first, step, n):
    return (n - 1) * step


def nth_term(first, step, n):
    return first + _gap(first, step, n)


def series_sum(first, step, n):
    return n * (2 * first + (n - 1) * step) // 2


def triangle(n):
    if n < 1:
        return 0
    return n * (n + 1) // 2


def squares_up_to(limit):
    out = []
    for k in range(1, limit + 1):
        if k * k > limit:
            break
        out.append(k * k)
    return out
''',
        "cases": {
            "nth_term": [[1, 1, 1], [2, 3, 4], [10, -2, 3], [0, 5, 6]],
            "series_sum": [[1, 1, 4], [2, 3, 5], [5, 0, 3], [1, 2, 1], [3, 4, 2]],
            "triangle": [[0], [1], [4], [7], [-3]],
            "squares_up_to": [[0], [1], [10], [16], [30]],
        },
    },
    "pagination": {
        "source": '''"""Pages of a list of results."""


def _start(page, per_page):
    return (page - 1) * per_page


def page_count(total, per_page=10):
    if total <= 0:
        return 1
    return (total + per_page - 1) // per_page


def page_items(items, page, per_page=3):
    start = _start(page, per_page)
    return items[start:start + per_page]


def has_next(page, total, per_page):
    return page * per_page < total


def page_of(index, per_page):
    return index // per_page + 1
''',
        "cases": {
            "page_count": [[0], [10], [11], [25, 5], [1, 4], [9, 3]],
            "page_items": [[[1, 2, 3, 4, 5, 6, 7], 1], [[1, 2, 3, 4, 5, 6, 7], 3], [[1, 2, 3, 4], 2, 2], [[], 1]],
            "has_next": [[1, 10, 3], [4, 12, 3], [3, 10, 3], [2, 5, 4]],
            "page_of": [[0, 3], [2, 3], [3, 3], [7, 2], [11, 5]],
        },
    },
    "parcels": {
        "source": '''"""Parcels: box counts, shipping costs and weight bands (weights in kg)."""


def _round_up(value, step):
    return (value + step - 1) // step


def boxes_needed(items, per_box=6):
    return _round_up(items, per_box)


def shipping_cost(weight):
    if weight <= 1:
        return 5
    if weight <= 10:
        return 5 + (weight - 1) * 2
    return 23 + (weight - 10) * 3


def band(weight):
    if weight < 2:
        return "small"
    if weight < 20:
        return "medium"
    return "large"


def pallet_load(boxes, per_layer, layers=4):
    full = per_layer * layers
    return [boxes // full, boxes % full]
''',
        "cases": {
            "boxes_needed": [[0], [6], [7], [13, 4], [1, 1]],
            "shipping_cost": [[0], [1], [2], [10], [11], [15]],
            "band": [[1], [2], [19], [20], [5]],
            "pallet_load": [[0, 3], [12, 3], [13, 3], [50, 5, 2], [7, 2, 1]],
        },
    },
    "dates": {
        "source": '''"""Calendar arithmetic on (month, day) pairs of a non-leap year."""

_MONTH_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def _days_before(month):
    return sum(_MONTH_DAYS[:month - 1])


def day_of_year(month, day):
    return _days_before(month) + day


def quarter(month):
    return (month - 1) // 3 + 1


def weeks_and_days(days):
    return [days // 7, days % 7]


def is_valid(month, day):
    if month < 1 or month > 12:
        return False
    return 1 <= day <= _MONTH_DAYS[month - 1]
''',
        "cases": {
            "day_of_year": [[1, 1], [2, 1], [3, 15], [12, 31]],
            "quarter": [[1], [3], [4], [6], [7], [12]],
            "weeks_and_days": [[0], [6], [7], [15], [30]],
            "is_valid": [[1, 31], [2, 29], [2, 28], [0, 5], [12, 1], [13, 1], [4, 0], [4, 30]],
        },
    },
    "digits": {
        "source": '''"""Digits of integers."""


def _digits(n):
    return [int(ch) for ch in str(abs(n))]


def digit_sum(n):
    return sum(_digits(n))


def last_digit(n):
    return abs(n) % 10


def round_to(n, step=5):
    return (n + step // 2) // step * step


def count_even_digits(n):
    count = 0
    for d in _digits(n):
        if d % 2 == 0:
            count = count + 1
    return count


def is_palindrome(n):
    text = str(n)
    for i in range(len(text) // 2):
        if text[i] != text[len(text) - 1 - i]:
            return False
    return True
''',
        "cases": {
            "digit_sum": [[0], [123], [-45], [909]],
            "last_digit": [[7], [123], [-58], [40]],
            "round_to": [[12], [13], [10], [0, 3], [14, 4], [17, 10]],
            "count_even_digits": [[0], [135], [2468], [-102]],
            "is_palindrome": [[7], [121], [123], [1221], [1231], [10]],
        },
    },
}
