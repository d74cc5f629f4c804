"""Multi-turn tool use (``task.name=tools``): an environment whose tools are a calculator and Python.

An episode is: the chat-templated prompt, then turns. In a turn the model samples until it ends
its answer (EOS) or closes a tool call (``<calculator>12*34</calculator>`` or
``<python>print(2**10)</python>``); the tool runs, and its output is appended as an observation,
``\\n<result>408</result>\\n``, inside the same assistant turn (the inline style of Search-R1 and
ReTool, which needs nothing from the chat template). The next turn continues from there.

It is one environment among the others (``Tools``: the contract in types/roles.py), run like any
of them by roles/rollout_env.py, token-exactly, in environment worker processes (the python tool's
sandbox too). A turn without a call is the final answer: its last integer against the row's answer
is the episode's one reward (0 for the turns that called a tool), which GRPO turns into one
advantage for every model token of the episode. Limits: ``task.max_turns`` model turns and
``task.max_episode_tokens`` tokens (model and tool together); each turn samples at most
``rollout.max_new_tokens``.
"""

from __future__ import annotations

import ast
import operator
import random
import re

from rlpost.envs.arithmetic import disjoint_splits, make_problem
from rlpost.envs.arithmetic import score as last_integer
from rlpost.sandbox import Limits, run_python

CALL = re.compile(r"<(calculator|python)>(.*?)</\1>", re.S)
STOPS = ["</calculator>", "</python>"]
RESULT_CHARS = 300  # an observation is capped: a tool printing megabytes must not flood the context

PROMPT = "What is {expr}?"
# One worked example as an earlier chat turn. Measured on the embedded model (64 episodes): with
# no example it never calls the tool (0/64, any instruction wording); with this one example it
# calls it in 22% of episodes and is right in 17%: a task GRPO can learn. With the instruction
# telling it in a system prompt how to call the calculator it calls the tool 80% of the time (too
# easy to learn from).
ONE_SHOT = [{"role": "user", "content": "What is 12 + 34?"},
            {"role": "assistant", "content": "<calculator>12+34</calculator>\n<result>46</result>\n46"}]


def score(completion: str, row: dict) -> tuple[float, dict]:
    """The arithmetic verifier on the final answer only: the text after the last tool result, so
    an episode that ends on a tool output (a limit hit mid-episode) has not answered."""
    final = completion.rpartition("</result>")[2]
    reward, info = last_integer(final, row)
    return reward, {**info, "tool_calls": completion.count("<result>")}


# --- tools -------------------------------------------------------------------------------------

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg,
        ast.UAdd: operator.pos}


def calculator(expression: str) -> str:
    """+ - * / // % ** and parentheses on numbers, by walking the syntax tree (never eval)."""

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError("unsupported expression")

    try:
        value = ev(ast.parse(expression.strip().replace("^", "**").replace("×", "*"), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as e:
        return f"error: {e}"
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def python(code: str) -> str:
    """Run the code in the sandbox (rlpost/sandbox/); the observation is its stdout, or the error."""
    result = run_python(code, limits=Limits(wall_s=5, cpu_s=5, memory_mb=256))
    if result.status == "ok":
        return result.stdout.strip()
    return f"error ({result.status}): {(result.stderr.strip().splitlines() or [''])[-1]}"


TOOLS = {"calculator": calculator, "python": python}


def observe(text: str, allowed: set[str]) -> str | None:
    """The observation for a turn that ended in a tool call, or None if the turn made no call."""
    calls = CALL.findall(text)  # the turn stopped at the first closing tag: its call is the last one
    if not calls:
        return None
    name, arg = calls[-1]
    out = TOOLS[name](arg) if name in allowed else f"error: the {name} tool is not available"
    return f"\n<result>{out[:RESULT_CHARS]}</result>\n"


class Tools:
    """The tools environment: inline observations, the final answer's last integer as the reward."""

    style = "inline"
    stop = STOPS

    def __init__(self, tools: str = "calculator,python"):
        self.allowed = set(filter(None, tools.split(",")))
        self.row: dict = {}

    def reset(self, row: dict) -> list[dict]:
        self.row = row
        return row["messages"]

    def step(self, message: dict) -> tuple[list[dict], float, bool, dict]:
        observation = observe(message["content"], self.allowed)
        if observation is None:  # no call: the turn is the final answer
            reward, info = last_integer(message["content"], self.row)
            return [], reward, True, {"correct": reward >= 1.0, **info}
        return [{"role": "tool", "content": observation}], 0.0, False, {"tool_calls": 1}


def build_splits(tcfg) -> tuple[list[dict], list[dict]]:
    """Multiplications too big for a small model to do in its head (3-digit x 2-digit)."""
    rng = random.Random(tcfg.seed)
    system = [{"role": "system", "content": tcfg.system_prompt}] if tcfg.system_prompt else []

    def row(expr: str, value: int) -> dict:
        user = {"role": "user", "content": PROMPT.format(expr=expr)}
        return {"messages": [*system, *ONE_SHOT, user], "answer": str(value), "expr": expr}

    train, heldout = disjoint_splits(lambda: make_problem(rng, "*", (100, 999), (11, 99), 2), tcfg.n_train,
                                     tcfg.n_heldout)
    return [row(e, v) for e, v in train], [row(e, v) for e, v in heldout]
