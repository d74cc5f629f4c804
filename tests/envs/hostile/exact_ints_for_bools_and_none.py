"""exactness: `is True`, `is False`, `is None` and == True take exactly that object: 1, 0, [],
'' and 0.0 do not."""
# form: call
# tests: ["assert f(1) is True", "assert f(2) is False", "assert f(3) is None", "assert f(4) == True",
#         "assert f(5) == False"]


def f(x):
    return {1: 1, 2: 0, 3: [], 4: 1.0, 5: ""}[x]
