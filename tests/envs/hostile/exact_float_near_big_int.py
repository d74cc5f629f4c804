"""exactness: a float near a large integer answer. Compared at rel_tol 1e-6 (an int expected, a
float returned) it passed; an int answer is exact."""
# form: call
# tests: ["assert f(100000000000000000) == 100000000000000001", "assert f(2) == 3", {"call": "f(10)", "expected": 11}]


def f(x):
    return float(x + 1) if x > 10 ** 9 else (x + 1) * (1 + 3e-7)
