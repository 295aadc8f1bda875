"""fastsum: the editable solution. Make `solve` faster without changing its answers.

The constants below are tuning knobs: any positive value gives the same results, only the speed differs.
"""

from functools import lru_cache
from itertools import compress

SEGMENT = 16      # numbers sieved per segment of the prime sieve
CACHE = 2048      # entries kept by the stopping-time cache (least recently used go first)


def prime_stats(limit):
    """(count, sum) of the primes <= limit, by a segmented sieve of Eratosthenes."""
    if limit < 2:
        return 0, 0
    segment = int(SEGMENT)
    if segment < 1:
        raise ValueError(f"SEGMENT must be a positive integer, not {SEGMENT!r}")
    root = int(limit ** 0.5)
    while root * root > limit:
        root -= 1
    while (root + 1) * (root + 1) <= limit:
        root += 1
    small = bytearray([1]) * (root + 1)
    small[0:2] = b"\x00\x00"
    for p in range(2, int(root ** 0.5) + 1):
        if small[p]:
            small[p * p::p] = bytes(len(range(p * p, root + 1, p)))
    base = [p for p in range(2, root + 1) if small[p]]
    count = total = 0
    for lo in range(2, limit + 1, segment):
        hi = min(lo + segment, limit + 1)
        seg = bytearray([1]) * (hi - lo)
        for p in base:
            if p * p >= hi:
                break
            start = max(p * p, (lo + p - 1) // p * p)
            if start < hi:
                seg[start - lo::p] = bytes(len(range(start, hi, p)))
        count += seg.count(1)
        total += sum(compress(range(lo, hi), seg))
    return count, total


def _stopping_time(x):
    """Collatz steps from x down to 1."""
    steps = 0
    while x != 1:
        x = x // 2 if x % 2 == 0 else 3 * x + 1
        steps += 1
    return steps


def stopping_total(n, period, offset):
    """sum(steps(offset + x % period) for x in range(n)), the steps cached in an LRU cache of CACHE entries."""
    size = int(CACHE)
    if size < 1:
        raise ValueError(f"CACHE must be a positive integer, not {CACHE!r}")
    steps = lru_cache(maxsize=size)(_stopping_time)
    return sum(steps(offset + x % period) for x in range(n))


def solve(task):
    """The answers the harness asks for: a dict of JSON numbers."""
    count, total = prime_stats(task["limit"])
    return {"prime_count": count, "prime_sum": total,
            "stopping_total": stopping_total(task["n"], task["period"], task["offset"])}
