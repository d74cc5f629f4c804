"""exactness: `==` on a float with no stated tolerance is exact, as Python's (once 1e-6, then
math.isclose's 1e-9): results 1e-8 and 1e-7 off, and a float one ulp-in-a-million off inside containers."""
# form: call
# tests: ["assert f(1) == 0.1", "assert f(2) == [0.2, {'k': 2.5}]", {"call": "f(3)", "expected": 0.3}]


def f(x):
    if x == 2:
        return [0.2 * (1 + 1e-7), {"k": 2.5 * (1 + 1e-7)}]
    return x / 10 * (1 + 1e-8)
