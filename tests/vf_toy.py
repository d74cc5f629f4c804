"""A verifiers environment module for tests, loaded by name with verifiers' own load_environment
(as an environment installed from its hub is): a single-turn, a multi-turn or a tool environment
over sums, each scored by a Rubric."""

import verifiers as vf
from datasets import Dataset


def _text(completion) -> str:
    return " ".join(m.content or "" for m in completion if m.role == "assistant")


def right_sum(completion, answer, **kwargs) -> float:
    return float(answer in _text(completion))


def _sums() -> Dataset:
    return Dataset.from_list([{"question": f"What is {a} + {b}?", "answer": str(a + b)}
                              for a in range(5) for b in range(5)])


class Hints(vf.MultiTurnEnv):
    """Says 'Try again.' after a wrong answer, 'Yes.' (and stops) after a right one."""

    async def env_response(self, messages, state, **kwargs):
        if state["answer"] in (messages[-1].content or ""):
            state["final_env_response"] = [vf.UserMessage(content="Yes.")]
            return [vf.UserMessage(content="Yes.")]
        return [vf.UserMessage(content="Try again.")]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def load_environment(kind: str = "single") -> vf.Environment:
    rubric = vf.Rubric(funcs=[right_sum], weights=[1.0])
    if kind == "single":
        return vf.SingleTurnEnv(dataset=_sums(), rubric=rubric)
    if kind == "multi":
        return Hints(dataset=_sums(), rubric=rubric, max_turns=3)
    return vf.ToolEnv(dataset=_sums(), tools=[add], rubric=rubric, max_turns=3)
