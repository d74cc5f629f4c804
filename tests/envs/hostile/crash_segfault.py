"""crash: unbounded recursion with the recursion limit lifted, until the C stack overflows."""
# form: call
import sys

sys.setrecursionlimit(10 ** 7)


def f(n):
    return f(n + 1) + 1


f(0)
