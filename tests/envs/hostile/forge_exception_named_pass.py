"""status forgery: a test that raises was reported by its exception's type name, and a type can be
named anything; these are named like every status a grader might count as a pass."""
# form: call
names = ["pass", "PASS", "pass\n", "ok", "passed", "True", "success"]


def add(a, b):
    name = names[(a + b) % len(names)]
    raise type(name, (Exception,), {})("forged")
