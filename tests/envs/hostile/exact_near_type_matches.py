"""exactness: the right digits in the wrong type: a str for an int, bytes for a str, a list for a
set, a set for a dict's keys, a float for an int off by a little."""
# form: call
# tests: ["assert f(1) == 3", "assert f(2) == 'ab'", "assert f(3) == {1, 2}", "assert f(4) == {'a': 1}",
#         "assert f(5) == 7"]


def f(x):
    return {1: "3", 2: b"ab", 3: [1, 2], 4: {"a"}, 5: 7.000001}[x]
