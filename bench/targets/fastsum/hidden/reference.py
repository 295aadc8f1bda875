"""fastsum's hidden reference: the evaluator's own answers, by other algorithms than solution.py's."""


def prime_stats(limit):
    """(count, sum) of the primes <= limit: one plain sieve over the whole range."""
    if limit < 2:
        return 0, 0
    sieve = bytearray([1]) * (limit + 1)
    sieve[0] = sieve[1] = 0
    p = 2
    while p * p <= limit:
        if sieve[p]:
            sieve[p * p::p] = bytes(len(range(p * p, limit + 1, p)))
        p += 1
    return sieve.count(1), sum(i for i, v in enumerate(sieve) if v)


def stopping_total(n, period, offset):
    """Each residue's Collatz steps once, weighted by how often x % period takes it for x < n."""
    full, rest = divmod(n, period)
    total = 0
    for r in range(period):
        x, steps = offset + r, 0
        while x != 1:
            x = x // 2 if x % 2 == 0 else 3 * x + 1
            steps += 1
        total += steps * (full + (1 if r < rest else 0))
    return total


def answer(task):
    count, total = prime_stats(task["limit"])
    return {"prime_count": count, "prime_sum": total,
            "stopping_total": stopping_total(task["n"], task["period"], task["offset"])}
