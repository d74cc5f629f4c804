"""Rollout role for multi-turn tool use (``task.name=tools``): episodes that interleave model
tokens and tool outputs, token-exactly. The tools, the prompt format and the verifier are in
``envs/tools.py``; this file runs the episodes on a sampler.

Token-exact: the trajectory is kept as token ids from the start. Each turn's model tokens are
exactly the ids the sampler drew (``HFRollout.sample_ids`` continues from ids, it never re-encodes
text), observations are encoded once and appended, and the training batch holds that same id
list. Re-tokenising the decoded text instead can merge or split tokens at the seams
("</calculator>" + "\\n" may encode differently from the two apart), so the trainer would score
tokens the sampler never drew. Observation tokens get ``completion_mask = 0`` and sampler log-prob
0: the policy did not choose them, so they carry no loss, but they stay in context.
"""

from __future__ import annotations

import torch

from rlpost.envs.tools import STOPS, observe
from rlpost.types.batch import Rollouts


class ToolRollout:
    """The rollout role for tool episodes: the same ``generate`` contract as the sampler it wraps
    (HFRollout or FastRollout), whose ``sample_ids`` runs each turn."""

    def __init__(self, rollout, tcfg):
        self.inner, self.tok = rollout, rollout.tok
        self.allowed = set(filter(None, tcfg.tools.split(",")))
        self.max_turns, self.max_tokens = tcfg.max_turns, tcfg.max_episode_tokens
        self.last_metrics: dict = {}  # tool calls, errors and turns of the last generate

    def load_weights(self, state, version: int | None = None) -> None:
        self.inner.load_weights(state, version)

    def sleep(self, discard_weights: bool = False) -> None:
        self.inner.sleep(discard_weights)

    @property
    def version(self) -> int:
        return self.inner.version

    def close(self) -> None:
        self.inner.close()

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
