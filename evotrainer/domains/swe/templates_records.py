"""Module templates on small records and collections (intervals, matrices, progress, passwords,
ratings, queues).

Same rules as ``templates``: self-contained, no ``while`` and no recursion, public functions that
call private helpers, and ``cases`` whose expected values come from running the correct code.
Indices, bounds and thresholds are written as integer constants and comparisons so that a one-token
change of each is a bug some case detects (a level-1 bug when it sits in a public function).
"""

from __future__ import annotations

_GRID = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
_QUEUE = [[3, 2], [7, 1]]

RECORD_TEMPLATES: dict[str, dict] = {
    "intervals": {
        "source": '''"""Closed-open intervals given as [start, end] pairs."""


def _length(start, end):
    return end - start


def overlap(a, b):
    lo = max(a[0], b[0])
    hi = min(a[1], b[1])
    if hi < lo:
        return 0
    return _length(lo, hi)


def contains(interval, x):
    return interval[0] <= x < interval[1]


def total_length(intervals):
    total = 0
    for iv in intervals:
        total = total + _length(iv[0], iv[1])
    return total


def midpoint(interval):
    return (interval[0] + interval[1]) / 2
''',
        "cases": {
            "overlap": [[[0, 5], [3, 9]], [[0, 2], [4, 6]], [[1, 4], [4, 8]], [[2, 9], [3, 5]]],
            "contains": [[[0, 5], 0], [[0, 5], 5], [[0, 5], 3], [[2, 4], 1], [[2, 4], 4]],
            "total_length": [[[[0, 2], [5, 9]]], [[]], [[[3, 4]]]],
            "midpoint": [[[0, 4]], [[1, 2]], [[-3, 3]], [[2, 9]]],
        },
    },
    "matrix": {
        "source": '''"""Square matrices as lists of rows."""


def _column(m, c):
    return [row[c] for row in m]


def transpose(m):
    return [_column(m, c) for c in range(len(m[0]))]


def trace(m):
    total = 0
    for i in range(len(m)):
        total = total + m[i][i]
    return total


def anti_diagonal(m):
    n = len(m)
    return [m[i][n - 1 - i] for i in range(n)]


def row_sums(m):
    return [sum(row) for row in m]


def corner_sum(m):
    return m[0][0] + m[0][-1] + m[-1][0] + m[-1][-1]
''',
        "cases": {
            "transpose": [[_GRID], [[[1, 2], [3, 4]]], [[[5]]]],
            "trace": [[_GRID], [[[2, 0], [0, 3]]], [[[7]]]],
            "anti_diagonal": [[_GRID], [[[1, 2], [3, 4]]], [[[6]]]],
            "row_sums": [[_GRID], [[[1, -1], [2, 2]]]],
            "corner_sum": [[_GRID], [[[1, 2], [3, 4]]], [[[2]]]],
        },
    },
    "progress": {
        "source": '''"""Progress counters and text bars."""


def _fraction(done, total):
    if total <= 0:
        return 0
    return done / total


def percent(done, total):
    if total <= 0:
        return 0
    return done * 100 // total


def bar(done, total, width=10):
    filled = int(_fraction(done, total) * width)
    return "#" * filled + "-" * (width - filled)


def remaining(done, total):
    left = total - done
    if left < 0:
        return 0
    return left


def eta(done, total, seconds):
    if done == 0:
        return -1
    return (total - done) * seconds // done
''',
        "cases": {
            "percent": [[0, 5], [1, 3], [5, 5], [2, 0], [7, 8], [1, 1]],
            "bar": [[0, 4], [2, 4], [4, 4], [1, 3, 6], [1, 0], [1, 1]],
            "remaining": [[3, 10], [10, 10], [12, 10], [0, 4]],
            "eta": [[0, 10, 5], [2, 10, 6], [5, 10, 3], [3, 4, 7], [9, 9, 4]],
        },
    },
    "passwords": {
        "source": '''"""Password rules."""


def _digits(text):
    return len([c for c in text if c.isdigit()])


def _uppers(text):
    return len([c for c in text if c.isupper()])


def long_enough(password, minimum=8):
    return len(password) >= minimum


def strength(password):
    score = 0
    if len(password) >= 8:
        score = score + 1
    if len(password) >= 12:
        score = score + 1
    if _digits(password) > 0:
        score = score + 1
    if _uppers(password) > 0:
        score = score + 1
    return score


def mask(password, shown=2):
    if len(password) <= shown:
        return "*" * len(password)
    return "*" * (len(password) - shown) + password[-shown:]


def repeats(password):
    count = 0
    for i in range(1, len(password)):
        if password[i] == password[i - 1]:
            count = count + 1
    return count
''',
        "cases": {
            "long_enough": [["abc"], ["abcdefgh"], ["abcdefg"], ["abcd", 4]],
            "strength": [["abc"], ["abcdefgh"], ["abcdefghijk"], ["abcdefghijkl"], ["Abc1"], ["passWord12345"]],
            "mask": [["secret"], ["ab"], ["a"], ["hunter2", 3], ["xyz", 0]],
            "repeats": [["abc"], ["aabbc"], [""], ["aaa"], ["abba"]],
        },
    },
    "ratings": {
        "source": '''"""Star ratings from review scores (1 to 5)."""


def _mean(values):
    if len(values) == 0:
        return 0
    return sum(values) / len(values)


def average(scores):
    return round(_mean(scores), 1)


def stars(score):
    if score >= 4.5:
        return 5
    if score >= 3.5:
        return 4
    if score >= 2.5:
        return 3
    return 1


def histogram(scores):
    counts = [0, 0, 0, 0, 0]
    for s in scores:
        counts[s - 1] = counts[s - 1] + 1
    return counts


def positive_share(scores, cutoff=4):
    good = len([s for s in scores if s >= cutoff])
    return round(100 * good / len(scores))
''',
        "cases": {
            "average": [[[5, 4, 4]], [[]], [[1, 2]], [[3, 4, 4, 5]]],
            "stars": [[4.5], [4.4], [3.5], [3.4], [2.5], [2.4], [5]],
            "histogram": [[[1, 5, 5]], [[]], [[2, 3, 3, 4]]],
            "positive_share": [[[5, 4, 1]], [[3, 3, 5]], [[4, 4]], [[2, 3, 5], 3]],
        },
    },
    "tickets": {
        "source": '''"""A ticket queue: tickets are [number, priority] pairs, priority 1 is the most urgent."""


def _urgent(ticket, level):
    return ticket[1] <= level


def next_number(tickets):
    if len(tickets) == 0:
        return 1
    return max(t[0] for t in tickets) + 1


def urgent(tickets, level=1):
    return [t[0] for t in tickets if _urgent(t, level)]


def position(tickets, number):
    for i in range(len(tickets)):
        if tickets[i][0] == number:
            return i + 1
    return 0


def wait_minutes(tickets, number, per_ticket):
    place = position(tickets, number)
    if place == 0:
        return -1
    return (place - 1) * per_ticket
''',
        "cases": {
            "next_number": [[[]], [_QUEUE], [[[1, 1]]]],
            "urgent": [[[[3, 2], [7, 1], [8, 1]]], [[[3, 2], [4, 3]], 2], [[]]],
            "position": [[_QUEUE, 3], [_QUEUE, 7], [[[3, 2]], 9], [[[5, 1], [6, 1], [8, 2]], 8]],
            "wait_minutes": [[_QUEUE, 7, 5], [_QUEUE, 3, 5], [[[3, 2]], 4, 2], [[[1, 1], [2, 1], [3, 1]], 3, 4]],
        },
    },
}
