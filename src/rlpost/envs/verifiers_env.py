"""The ``verifiers`` library's environments on rlpost's sampler (``task.env=verifiers:ENV_ID``;
``pip install 'rlpost[verifiers]'``).

verifiers (the environment library of prime-rl and its environment hub) packages an environment as
an installed module with ``load_environment(**args)``: a dataset, a rollout protocol
(``SingleTurnEnv``, ``MultiTurnEnv`` with its ``env_response``, ``ToolEnv`` with Python functions
as tools) and a ``Rubric`` that scores a finished rollout. Here ``vf.load_environment(ENV_ID,
**task.env_args)`` loads it by name in the environment worker, its dataset gives the rows (its eval
dataset the held-out rows, when it has one), its own rollout loop decides what the environment says
and when the episode ends, and its rubric's reward is the episode's reward (on the last turn).

How the loop runs on rlpost's sampler: verifiers asks a client for each model turn. The client
here answers from the assistant messages the episode has so far, and at the first turn it has no
answer for, it stops the loop there and hands the prompt it was asked (everything the environment
said) back to rlpost. A verifiers rollout holds a running event loop, which cannot travel between
worker processes as an rlpost environment does (envs/worker.py), so each step replays the episode
from its start: the environment's ``env_response`` (and its tools) run again for the earlier turns,
and must give the same messages for the same conversation. Pinned to verifiers 0.3: 0.4 dropped
this stack (its v1 stack runs agents through an OpenAI-compatible server instead).
"""

from __future__ import annotations

import asyncio
import functools
import json
import time

import verifiers as vf
from verifiers.types import Response, ResponseMessage, ToolCall


class NeedModel(Exception):
    """verifiers asked for a model turn the episode does not have yet: the prompt it asked with."""

    def __init__(self, prompt, tools):
        super().__init__("the next model turn")
        self.prompt, self.tools = prompt, tools


class Replay(vf.Client):
    """A verifiers client that answers with the episode's assistant messages, in order, then stops."""

    def __init__(self, answers: list[dict]):
        super().__init__(None)
        self.answers, self.asked = answers, 0

    async def get_response(self, prompt, model, sampling_args, tools=None, **kwargs) -> Response:
        if self.asked == len(self.answers):
            raise NeedModel(prompt, tools)
        m, self.asked = self.answers[self.asked], self.asked + 1
        calls = [ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                 for c in m.get("tool_calls", [])]
        message = ResponseMessage(content=m["content"], tool_calls=calls or None, is_truncated=False,
                                  finish_reason="tool_calls" if calls else "stop")
        return Response(id=f"rlpost-{self.asked}", created=int(time.time()), model=model, message=message)

    # the rest of the client interface is for talking to a server; nothing here does
    def setup_client(self, config): raise NotImplementedError  # noqa: E704
    async def to_native_tool(self, tool): raise NotImplementedError  # noqa: E704
    async def to_native_prompt(self, messages): raise NotImplementedError  # noqa: E704
    async def get_native_response(self, *args, **kwargs): raise NotImplementedError  # noqa: E704
    async def raise_from_native_response(self, response): raise NotImplementedError  # noqa: E704
    async def from_native_response(self, response): raise NotImplementedError  # noqa: E704
    async def close(self) -> None: return None  # noqa: E704


@functools.lru_cache(maxsize=4)
def loaded(env_id: str, args: str):
    """The verifiers environment, loaded once per worker process (its dataset can be large)."""
    return vf.load_environment(env_id, **json.loads(args))


def plain(m) -> dict:
    """A verifiers message as a chat message dict (tool calls in OpenAI's form)."""
    content = m.content if isinstance(m.content, str) else "".join(getattr(p, "text", "") for p in m.content or [])
    out = {"role": m.role, "content": content}
    if getattr(m, "tool_call_id", None):
        out["tool_call_id"] = m.tool_call_id
    if getattr(m, "tool_calls", None):
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in m.tool_calls]
    return out


def schema(tool) -> dict:
    """A verifiers tool definition as an OpenAI-style JSON schema (what chat templates render)."""
    return {"type": "function",
            "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters}}


class VerifiersEnv:
    """An installed verifiers environment, as an rlpost environment."""

    def __init__(self, env_id: str, **env_args):
        self.env_id, self.args = env_id, json.dumps(env_args, sort_keys=True)
        self.row: dict = {}
        self.answers: list[dict] = []
        self.seen = 0  # messages of the prompt verifiers last asked with
        self.tools = None

    @property
    def env(self):
        return loaded(self.env_id, self.args)

    def rows(self, split: str, n: int, seed: int) -> list[dict]:
        """Its dataset's rows (the eval dataset held out, when it has one; else the last rows)."""
        env = self.env
        has_eval = env.eval_dataset is not None or env.eval_dataset_source is not None
        data = env.get_eval_dataset(seed=seed) if split == "heldout" and has_eval else env.get_dataset(seed=seed)
        rows = [dict(r) for r in data]
        if split == "heldout" and not has_eval:
            rows = rows[len(rows) // 2:]
        elif split == "train" and not has_eval:
            rows = rows[: len(rows) // 2] or rows
        return [{**r, "vf_example": i} for i, r in enumerate(rows[:n])]

    def _replay(self):
        """Run the verifiers rollout over the episode's answers: the prompt of the next turn, or the finished state."""
        row = {k: v for k, v in self.row.items() if k != "vf_example"}

        async def run():
            try:
                return await self.env.rollout(row, Replay(self.answers), "rlpost", {})
            except NeedModel as asked:
                return asked

        return asyncio.run(run())

    def reset(self, row: dict) -> list[dict]:
        self.row, self.answers = row, []
        asked = self._replay()
        if not isinstance(asked, NeedModel):
            raise RuntimeError(f"verifiers environment {self.env_id} ended before the model's first turn")
        self.seen = len(asked.prompt)
        self.tools = [schema(t) for t in asked.tools or []] or None
        return [plain(m) for m in asked.prompt]

    def step(self, message: dict) -> tuple[list[dict], float, bool, dict]:
        self.answers.append(message)
        out = self._replay()
        calls = len(message.get("tool_calls", []))
        if isinstance(out, NeedModel):
            new = [plain(m) for m in out.prompt[self.seen + 1:]]  # after the assistant's message
            self.seen = len(out.prompt)
            return new, 0.0, False, {"tool_calls": calls}
        asyncio.run(self.score(out))
        return [], float(out["reward"] or 0.0), True, {"tool_calls": calls}

    async def score(self, state) -> None:
        """The rubric's reward (a rubric with group-level functions scores this episode as a group of one)."""
        try:
            await self.env.rubric.score_rollout(state)
        except AssertionError:
            await self.env.rubric.score_group([state])
