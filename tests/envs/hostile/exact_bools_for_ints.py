"""exactness: bool is not int. True for 1 and False for 0, at the top, in lists, as dict keys and
set members (Python hashes True as 1, so {True: x} == {1: x} and {True, 2} == {1, 2})."""
# form: call
# tests: ["assert f(1) == 1", "assert f(2) == [1, 0]", "assert f(3) == {1: 'a', 0: 'b'}", "assert f(4) == {1, 2}",
#         "assert f(5) == {(1, 0): 'x'}"]


def f(x):
    return {1: True, 2: [True, False], 3: {True: "a", False: "b"}, 4: {True, 2}, 5: {(True, False): "x"}}[x]
