"""fastsum's gate: solution.py's answers on small cases (they must not depend on the tuning constants)."""

import unittest

import harness
import solution


def brute_primes(limit):
    return [p for p in range(2, limit + 1) if all(p % d for d in range(2, int(p ** 0.5) + 1))]


def brute_steps(x):
    steps = 0
    while x != 1:
        x = 3 * x + 1 if x % 2 else x // 2
        steps += 1
    return steps


class SolutionTest(unittest.TestCase):
    def test_prime_stats_on_small_limits(self):
        for limit in (0, 1, 2, 3, 4, 10, 97, 100, 101, 1000, 2310, 4099):
            primes = brute_primes(limit)
            self.assertEqual(solution.prime_stats(limit), (len(primes), sum(primes)), limit)

    def test_prime_stats_on_a_known_value(self):
        self.assertEqual(solution.prime_stats(100_000), (9592, 454396537))

    def test_stopping_total(self):
        for n, period, offset in ((0, 5, 1), (1, 1, 1), (50, 7, 1), (400, 30, 1000), (1000, 999, 27)):
            want = sum(brute_steps(offset + x % period) for x in range(n))
            self.assertEqual(solution.stopping_total(n, period, offset), want, (n, period, offset))

    def test_solve_returns_the_three_numbers(self):
        task = {"limit": 500, "n": 100, "period": 9, "offset": 10}
        got = solution.solve(dict(task))
        self.assertEqual(sorted(got), ["prime_count", "prime_sum", "stopping_total"])

    def test_harness_and_evaluator_derive_the_same_task(self):
        import evaluate

        for seed in (0, 1, 1001, 2**31 - 1):
            self.assertEqual(harness.task_for(seed), evaluate.task_for(seed))


if __name__ == "__main__":
    unittest.main()
