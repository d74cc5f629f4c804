"""A reward function and an environment that hand back objects of this module's own classes:
unpickling one in the trainer would import this module there (tests/rewards/test_runner.py and
tests/envs/test_episodes.py check it never is)."""


class Verdict:
    def __repr__(self):
        return "Verdict()"


class Text(str):
    """A string of this module's own class: it passes an isinstance(str) check, and pickles by class."""


def score(completion, row):
    return float(len(completion) % 2), {"verdict": Verdict(), "n": 3}


class Env:
    """One turn: a Verdict in the step's info, and for a row with 'leak', the answer's content as a Text."""

    def rows(self, split, n, seed):
        return [{"leak": False} for _ in range(n)]

    def reset(self, row):
        self.leak = row.get("leak", False)
        return "say something"

    def step(self, message):
        content = Text("thanks") if self.leak else "thanks"
        return [{"role": "user", "content": content}], 1.0, True, {"verdict": Verdict(), "correct": True}
