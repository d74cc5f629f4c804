"""Rollout role for environments (``task.name=env``, ``tools``): multi-turn episodes on any sampler,
token-exactly, with the environment's calls in worker processes (envs/pool.py).

An episode: the environment's opening messages through the chat template, then turns. The sampler
draws the assistant's turn (until an end-of-sequence token, a stop string of an inline
environment, or rollout.max_new_tokens); the environment's ``step`` gets that message and answers
with its messages, a reward for the turn and whether the episode is over. Its messages are encoded
as the template renders them (envs/transcript.py) and appended; the next turn continues from
there. An episode also ends at task.max_turns turns or task.max_episode_tokens tokens (model and
environment together); the last turn is still given to ``step`` (so the final attempt is scored),
and its answer is not appended.

Token-exact: each turn's model tokens are exactly the ids the sampler drew (``sample_ids``
continues from ids, it never re-encodes text), the environment's tokens are encoded once and
appended, and the batch holds that same id list. Environment tokens get ``completion_mask = 0``
and sampler log-prob 0: the policy did not choose them, so they carry no loss, but they are in
context. ``turn_end`` marks each turn's last model token and ``turn_reward`` holds the turn's
reward there, for the credit rules (algorithms/turns.py); ``episodes`` holds what each episode did.

Overlap: the episodes whose environment has answered are decoded as one batch while the
environment workers step the others. A batch is decoded once at least as many episodes are ready
as are still with the environment (and the rest had GATHER_S more to answer), so a slow
environment (code tests in a sandbox) overlaps the sampler without the sampler decoding one
episode at a time.
"""

from __future__ import annotations

import time

import torch

from rlpost.console import say_once
from rlpost.envs.pool import EnvPool, warn_once
from rlpost.envs.transcript import (TemplateError, assistant_message, chat_delta, encode, for_template, inline_delta,
                                    opening_ids, render)
from rlpost.types.batch import Rollouts
from rlpost.types.errors import ConfigError


class Episode:
    """One episode's tokens (model and environment), its messages and what it did."""

    def __init__(self, row: dict):
        self.row, self.env = row, None  # env: the environment object, pickled (it lives in the workers)
        self.prompt: list[int] = []
        self.ids: list[int] = []
        self.mask: list[bool] = []
        self.logp: list[float] = []
        self.ends: list[int] = []  # index in ids of each turn's last model token
        self.rewards: list[float] = []  # each turn's reward
        self.history: list[dict] = []
        self.opening: list[dict] = [{"role": "user", "content": ""}]  # what reset gave (a failed reset: nothing)
        self.tools, self.style, self.stop = None, "chat", []
        self.done, self.stopped, self.error, self.timeout = False, "", "", False
        self.tool_calls, self.correct, self.closed = 0, None, True

    def add(self, ids: list[int], logps: list[float] | None) -> None:
        self.ids += ids
        self.mask += [logps is not None] * len(ids)
        self.logp += logps if logps is not None else [0.0] * len(ids)
        if logps is not None and ids:
            self.ends.append(len(self.ids) - 1)

    def end(self, why: str) -> None:
        self.done, self.stopped = True, why

    def fail(self, outcome: tuple) -> None:
        """A call that raised, timed out, died or returned garbage: the episode ends, scored 0."""
        self.timeout = outcome[0] == "timeout"
        self.error = "timed out" if self.timeout else outcome[1]
        self.rewards = [0.0] * len(self.ends)
        self.end("error")

    def record(self) -> dict:
        out = {"turns": len(self.ends), "turn_rewards": self.rewards, "tool_calls": self.tool_calls,
               "stop": self.stopped}
        if self.error:
            out.update(error=self.error, timeout=self.timeout)
        if self.correct is not None:
            out["correct"] = self.correct
        return out


# An opening past this many times the model's context stops the run (_open).
OPENING_PAST_CONTEXT = 4


class EpisodeRollout:
    """What the episode rollouts (EnvRollout here, roles/rollout_agent.py: AgentRollout) share: the
    sampler they wrap answers for the weights, and their workers close with it."""

    def __init__(self, rollout, pool):
        self.inner, self.tok, self.pool = rollout, rollout.tok, pool
        self.reported: set[str] = set()
        self.last_metrics: dict = {}

    @property
    def version(self) -> int:
        return self.inner.version

    def load_weights(self, state, version: int | None = None) -> None:
        self.inner.load_weights(state, version)

    def sleep(self, discard_weights: bool = False) -> None:
        self.inner.sleep(discard_weights)

    def close(self) -> None:
        self.pool.close()
        self.inner.close()


class EnvRollout(EpisodeRollout):
    """The rollout role for environment episodes: the same ``generate`` contract as the sampler it
    wraps (FastRollout, HFRollout, vLLM), whose ``sample_ids`` draws each turn."""

    # Once at least as many episodes are ready as are still with the environment, the rest get this
    # long to answer too: a fast environment (a game's reply) then answers a whole turn before the
    # next decode, where a slow one (tests in a sandbox) overlaps it.
    GATHER_S = 0.05

    def __init__(self, rollout, pool: EnvPool, max_turns: int, max_episode_tokens: int, context: int = 0):
        """context: the model's, in tokens (0: not known), which an opening must leave a turn's room in."""
        super().__init__(rollout, pool)
        self.max_turns, self.max_tokens, self.context = max_turns, max_episode_tokens, context
        self.eos_texts = [self.tok.decode([i]) for i in sorted(rollout.eos_set)]

    def room(self, e: Episode) -> int:
        return self.max_tokens - len(e.ids)

    def generate(self, rows: list[dict], n: int, temperature: float, top_p: float, max_new_tokens: int) -> Rollouts:
        episodes = [Episode(r) for r in rows for _ in range(n)]
        for e, outcome in zip(episodes, self.pool.run([{"op": "reset", "row": e.row} for e in episodes])):
            self._open(e, outcome, min(max_new_tokens, self.max_tokens))
        ready, waiting, decodes, waited, decide_at = [e for e in episodes if not e.done], {}, 0, 0.0, None
        while ready or waiting:
            if ready and len(ready) >= len(waiting):
                decide_at = decide_at or time.monotonic() + self.GATHER_S
                if not waiting or time.monotonic() >= decide_at:
                    self._turn(ready, temperature, top_p, max_new_tokens, waiting)
                    ready, decodes, decide_at = [], decodes + 1, None
                    continue
            t0 = time.perf_counter()
            for i, outcome in self.pool.poll(None if decide_at is None else max(0.0, decide_at - time.monotonic())):
                e = waiting.pop(i)
                if self._answer(e, outcome):
                    ready.append(e)
            waited += time.perf_counter() - t0
        self.last_metrics = {"env/decode_calls": decodes, "timing_s/env_wait": waited}
        return assemble(episodes, rows, n, self.tok, self.version)

    def _open(self, e: Episode, outcome: tuple, turn: int) -> None:
        """The episode's prompt from reset's outcome. An opening that leaves no room for a ``turn`` of
        tokens in the model's context is said once, and past OPENING_PAST_CONTEXT times it is a
        ConfigError (a 900 KB opening would otherwise be sampled from, and end as an allocation the
        machine cannot make, reported as out of memory)."""
        if outcome[0] != "ok":
            self._failed(e, outcome)
            e.prompt = [self.tok.pad_token_id]  # no turn: an empty completion, scored 0
            return
        p = outcome[1]
        e.env, e.tools, e.style, e.stop, e.history = p["env"], p["tools"], p["style"], p["stop"], p["messages"]
        e.opening = list(p["messages"])
        e.prompt = opening_ids(self.tok, e.history, e.tools)
        if e.style == "chat" and e.tools and "template ignores tools" not in self.reported:
            self.reported.add("template ignores tools")  # asked of the first opening with tools, told once
            if tools_ignored(self.tok, e.history, e.tools):  # once a run: the held-out passes build rollouts too
                say_once(template_ignores_tools(self.tok, len(e.tools)),
                         key=f"template ignores tools: {self.pool.path}")
        if self.context and len(e.prompt) + turn > self.context:
            chars = sum(len(str(m.get("content", ""))) for m in e.opening)
            sizes = (f"{len(e.prompt)} tokens ({chars} characters), and the model takes {self.context} tokens, {turn} "
                     "of them for the first turn (rollout.max_new_tokens, at most task.max_episode_tokens)")
            # A rotary model runs past its nominal context (a game's rules of 510 tokens on the 256-token tiny
            # model train), so a little past it is said once; far past it is a reset() bug whose one sequence
            # would end as an allocation the machine cannot make, so it stops the run in one line.
            if len(e.prompt) + turn > OPENING_PAST_CONTEXT * self.context:
                raise ConfigError(f"{self.pool.key} {self.pool.path}: reset() returned an opening longer than the "
                                  f"model's context: {sizes}; shorten what reset() returns")
            # once a run (the held-out passes build rollouts of their own)
            say_once(key=f"opening past context: {self.pool.path}", message=(
                f"{self.pool.key} {self.pool.path}: reset() returned an opening past the model's context: {sizes}; "
                "the model samples at positions it was not trained on (said once; more than "
                f"{OPENING_PAST_CONTEXT}x the context stops the run)"))

    def _turn(self, ready: list[Episode], temperature: float, top_p: float, max_new_tokens: int, waiting: dict) -> None:
        """One assistant turn for every ready episode, in one sampler call; each goes to its environment."""
        budget = min(max_new_tokens, max(self.room(e) for e in ready))
        stops = sorted({s for e in ready for s in e.stop})
        outs = self.inner.sample_ids([e.prompt + e.ids for e in ready], temperature, top_p, budget, stops)
        for e, (ids, logps, how) in zip(ready, outs):
            room = self.room(e)
            e.closed = how == "eos" and len(ids) <= room
            e.add(ids[:room], logps[:room])
            message = assistant_message(self.tok.decode(ids[:room], skip_special_tokens=True))
            e.history.append(for_template(message))
            self.pool.submit(id(e), {"op": "step", "env": e.env, "message": message})
            waiting[id(e)] = e

    def _answer(self, e: Episode, outcome: tuple) -> bool:
        """The environment's answer to a turn; True when the episode goes on to another turn."""
        if outcome[0] != "ok":
            self._failed(e, outcome)
            return False
        p = outcome[1]
        e.env = p["env"]
        e.rewards.append(p["reward"])
        e.tool_calls += int(p["info"].get("tool_calls", 0) or 0)
        e.correct = p["info"].get("correct", e.correct)
        if p["done"] or len(e.ends) >= self.max_turns or self.room(e) <= 0:
            e.end("done" if p["done"] else "max_turns" if len(e.ends) >= self.max_turns else "max_tokens")
            return False
        try:
            delta = (chat_delta(self.tok, e.history, p["messages"], e.tools, self.eos_texts, e.closed)
                     if e.style == "chat" else inline_delta(p["messages"]))
        except TemplateError as err:
            raise ConfigError(f"task.env: {err}") from None
        e.add(encode(self.tok, delta)[: self.room(e)], None)
        e.history += p["messages"]
        if self.room(e) <= 0:
            e.end("max_tokens")
            return False
        return True

    def _failed(self, e: Episode, outcome: tuple) -> None:
        e.fail(outcome)
        kind = "timeout" if e.timeout else "error"
        text = (f"timed out after {self.pool.timeout_s:g} s (task.env_timeout_s); the call was killed" if e.timeout
                else e.error)
        warn_once(self.reported, kind, self.pool.path, f"{text}; the episode ended with reward 0")


def tools_ignored(tok, messages: list[dict], tools: list[dict]) -> bool:
    """Whether the chat template renders the opening the same with and without its tools: then the
    model is never shown them."""
    return render(tok, messages, tools, True) == render(tok, messages, None, True)


def template_ignores_tools(tok, n: int) -> str:
    return (f"task.env: the chat template of {tok.name_or_path or 'this model'} renders nothing of the environment's "
            f"{n} tool{'s' if n > 1 else ''}, so the model is never shown {'them' if n > 1 else 'it'} and will make no "
            "tool calls; use a "
            "model whose template renders tools (Qwen2.5-Instruct, Llama-3.1-Instruct, ...), or an environment in "
            "the inline style (style='inline' with its stop strings: docs/environments.md)")


def assemble(episodes: list[Episode], rows: list[dict], n: int, tok, version: int) -> Rollouts:
    """One Rollouts from episodes: prompts left-padded, trajectories right-padded; the turn marks.
    A row without chat messages of its own carries its episode's opening messages; every row carries
    the opening and its tools as ``_opening`` and ``_tools``, which the samples files keep."""
    pad = tok.pad_token_id
    P, T = max(len(e.prompt) for e in episodes), max(1, max(len(e.ids) for e in episodes))
    ends = torch.zeros(len(episodes), T, dtype=torch.bool)
    rewards = torch.zeros(len(episodes), T)
    for b, e in enumerate(episodes):
        ends[b, e.ends] = True
        rewards[b, e.ends] = torch.tensor(e.rewards + [0.0] * (len(e.ends) - len(e.rewards)))
    mask = torch.tensor([e.mask + [False] * (T - len(e.ids)) for e in episodes])
    return Rollouts(
        prompt_ids=torch.tensor([[pad] * (P - len(e.prompt)) + e.prompt for e in episodes]),
        prompt_mask=torch.tensor([[False] * (P - len(e.prompt)) + [True] * len(e.prompt) for e in episodes]),
        completion_ids=torch.tensor([e.ids + [pad] * (T - len(e.ids)) for e in episodes]),
        completion_mask=mask,
        sampler_logp=torch.tensor([e.logp + [0.0] * (T - len(e.ids)) for e in episodes]) * mask,
        truncated=torch.tensor([e.stopped != "done" for e in episodes]),
        group_ids=torch.arange(len(rows)).repeat_interleave(n),
        # the prompt, as logged; with the whole opening and its tools for the samples (observe/runlog.py: sample_extras)
        rows=[{**e.row, **({} if "messages" in e.row else {"messages": e.opening}), "_opening": e.opening,
               **({"_tools": e.tools} if e.tools else {})} for e in episodes],
        completions=[tok.decode(e.ids, skip_special_tokens=e.style == "inline") for e in episodes],
        policy_version=version,
        turn_end=ends, turn_reward=rewards, episodes=[e.record() for e in episodes],
    )
