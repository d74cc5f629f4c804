"""Multi-turn tool use: episodes that interleave model tokens and tool outputs, token-exactly.

An episode is: the chat-templated prompt, then turns. In a turn the model samples until it ends
its answer (EOS) or closes a tool call (``<calculator>12*34</calculator>`` or
``<python>print(2**10)</python>``); the tool runs, and its output is appended as an observation,
``\\n<result>408</result>\\n``, inside the same assistant turn (the inline style of Search-R1 and
ReTool, which needs nothing from the chat template). The next turn continues from there.

Token-exact: the trajectory is kept as token ids from the start. Each turn's model tokens are
exactly the ids the sampler drew (``HFRollout.sample_ids`` continues from ids, it never re-encodes
text), observations are encoded once and appended, and the training batch holds that same id
list. Re-tokenising the decoded text instead can merge or split tokens at the seams
("</calculator>" + "\\n" may encode differently from the two apart), so the trainer would score
tokens the sampler never drew. Observation tokens get ``completion_mask = 0`` and sampler log-prob
0: the policy did not choose them, so they carry no loss, but they stay in context.

Limits: ``task.max_turns`` model turns and ``task.max_episode_tokens`` tokens (model and tool
together); each turn samples at most ``rollout.max_new_tokens``. An episode that hits a limit
without a final answer is 'truncated'. The reward is the verifier's score of the final answer
(the text after the last observation): one trajectory-level reward, which GRPO turns into one
advantage for every model token of the episode.
"""

from __future__ import annotations

import ast
import operator
import random
import re

CALL = re.compile(r"<(calculator|python)>(.*?)</\1>", re.S)
STOPS = ["</calculator>", "</python>"]
RESULT_CHARS = 300  # an observation is capped: a tool printing megabytes must not flood the context

PROMPT = "What is {expr}?"
# One worked example as an earlier chat turn. Measured on the embedded model (64 episodes): with
# no example it never calls the tool (0/64, any instruction wording); with this one example it
# calls it in 22% of episodes and is right in 17%: a task GRPO can learn. With the instruction
# below as the system prompt as well it calls the tool 80% of the time (too easy to learn from).
ONE_SHOT = [{"role": "user", "content": "What is 12 + 34?"},
            {"role": "assistant", "content": "<calculator>12+34</calculator>\n<result>46</result>\n46"}]
SYSTEM_PROMPT = (
    "You can use a calculator. To use it, write <calculator>EXPRESSION</calculator>, for example "
    "<calculator>12*34</calculator>, and you will get <result>408</result>. "
    "Then reply with only the final number."
)


def score(completion: str, row: dict) -> tuple[float, dict]:
    """The arithmetic verifier on the final answer only: the text after the last tool result, so
    an episode that ends on a tool output (a limit hit mid-episode) has not answered."""
    from rlpost.envs.arithmetic import score as last_integer

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
    """Run the code in the sandbox (envs/sandbox.py); the observation is its stdout, or the error."""
    from rlpost.envs.sandbox import Limits, run_python

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


# --- episodes ----------------------------------------------------------------------------------


class ToolRollout:
    """The rollout role for tool episodes: same ``generate`` contract as HFRollout, built on it."""

    def __init__(self, rollout, tcfg):
        self.inner, self.tok = rollout, rollout.tok
        self.allowed = set(filter(None, tcfg.tools.split(",")))
        self.max_turns, self.max_tokens = tcfg.max_turns, tcfg.max_episode_tokens

    def load_weights(self, state, version: int | None = None) -> None:
        self.inner.load_weights(state, version)

    def sleep(self, discard_weights: bool = False) -> None:
        self.inner.sleep(discard_weights)

    @property
    def version(self) -> int:
        return getattr(self.inner, "version", 0)

    def generate(self, rows: list[dict], n: int, temperature: float, top_p: float, max_new_tokens: int):
        rows = [r for r in rows for _ in range(n)]
        prompts = [self.tok(t, add_special_tokens=False).input_ids for t in self.inner.render(rows)]
        episodes = [Episode() for _ in rows]
        calls = errors = 0
        for _ in range(self.max_turns):
            live = [i for i, e in enumerate(episodes) if not e.done]
            if not live:
                break
            budget = min(max_new_tokens, max(self.max_tokens - len(episodes[i].ids) for i in live))
            outs = self.inner.sample_ids([prompts[i] + episodes[i].ids for i in live], temperature, top_p, budget, STOPS)
            for i, (ids, logps, how) in zip(live, outs):
                e = episodes[i]
                room = self.max_tokens - len(e.ids)
                e.add(ids[:room], logps[:room], model=True)
                obs = observe(self.tok.decode(ids), self.allowed) if how == "stop" and len(ids) <= room else None
                if how == "eos" and len(ids) <= room:
                    e.done, e.finished = True, True
                elif obs is None or len(e.ids) >= self.max_tokens:
                    e.done = True  # no call to answer, or out of tokens: the episode ends unfinished
                else:
                    calls += 1
                    errors += obs.startswith("\n<result>error")
                    obs_ids = self.tok(obs, add_special_tokens=False).input_ids
                    e.add(obs_ids[: self.max_tokens - len(e.ids)], None, model=False)
                    e.done = len(e.ids) >= self.max_tokens
        batch = assemble(prompts, episodes, rows, n, self.tok)
        batch.infos, batch.policy_version = [], self.version
        self.last_metrics = {"tools/calls_per_episode": calls / len(rows), "tools/errors": errors,
                             "tools/turns_mean": sum(e.turns for e in episodes) / len(rows)}
        return batch


class Episode:
    def __init__(self):
        self.ids: list[int] = []
        self.mask: list[bool] = []
        self.logp: list[float] = []
        self.done = self.finished = False
        self.turns = 0

    def add(self, ids: list[int], logps: list[float] | None, model: bool) -> None:
        self.ids += ids
        self.mask += [model] * len(ids)
        self.logp += logps if model else [0.0] * len(ids)
        self.turns += model


def assemble(prompts: list[list[int]], episodes: list[Episode], rows: list[dict], n: int, tok):
    """One Rollouts from token-id episodes: prompts left-padded, trajectories right-padded."""
    import torch  # here, not at the top: the verifier worker imports this module for `score`

    from rlpost.batch import Rollouts

    pad = tok.pad_token_id
    P, T = max(map(len, prompts)), max(1, max(len(e.ids) for e in episodes))
    prompt_ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[False] * (P - len(p)) + [True] * len(p) for p in prompts])
    completion_ids = torch.tensor([e.ids + [pad] * (T - len(e.ids)) for e in episodes])
    mask = torch.tensor([e.mask + [False] * (T - len(e.ids)) for e in episodes])
    logp = torch.tensor([e.logp + [0.0] * (T - len(e.ids)) for e in episodes])
    return Rollouts(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids, completion_mask=mask,
        sampler_logp=logp * mask, truncated=torch.tensor([not e.finished for e in episodes]),
        group_ids=torch.arange(len(rows) // n).repeat_interleave(n), rows=rows,
        completions=[tok.decode(e.ids, skip_special_tokens=True) for e in episodes],
    )


def build_splits(tcfg) -> tuple[list[dict], list[dict]]:
    """Multiplications too big for a small model to do in its head (3-digit x 2-digit)."""
    from rlpost.envs.arithmetic import disjoint_splits, make_problem

    rng = random.Random(tcfg.seed)
    system = [{"role": "system", "content": tcfg.system_prompt}] if tcfg.system_prompt else []

    def row(expr: str, value: int) -> dict:
        user = {"role": "user", "content": PROMPT.format(expr=expr)}
        return {"messages": [*system, *ONE_SHOT, user], "answer": str(value), "expr": expr}

    train, heldout = disjoint_splits(lambda: make_problem(rng, "*", (100, 999), (11, 99), 2), tcfg.n_train, tcfg.n_heldout)
    return [row(e, v) for e, v in train], [row(e, v) for e, v in heldout]
