"""A reward function whose info holds an object of this module's own class: unpickling it in the
trainer would import this module there (tests/rewards/test_runner.py checks it never is)."""


class Verdict:
    def __repr__(self):
        return "Verdict()"


def score(completion, row):
    return float(len(completion) % 2), {"verdict": Verdict(), "n": 3}
