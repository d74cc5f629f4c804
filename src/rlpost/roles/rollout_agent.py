"""Rollout role for agents by import path (``task.name=agent task.agent=module:fn``): the agent you
already have, written against the ``openai`` client, trains as it is.

An episode: ``fn(client, row)`` runs in a worker process (envs/agents.py, the one worker pool with its
deadline, task.agent_timeout_s), with a client whose base URL is the episode's own on the endpoint
over this sampler (roles/endpoint.py). Every call it makes is decoded here, batched with the calls
of the other episodes, and recorded token for token; what it returns is its reward (a number on the
last call, or a list with one per call, for task.turn_credit=turn), or a transcript that
task.verifier scores.

The training sequence is the recorded tokens only: the first call's prompt, then per call what the
agent inserted since the last call's tokens (masked: context, no loss) and the drawn tokens (with
their sampler log-probs, ``turn_end`` on the last), as environment episodes are
(roles/rollout_env.py: the same Episode, the same ``assemble``, the same EpisodeReward). A call
that does not continue the sequence (an agent that rewrote its history) is served and not recorded.

Bad agents lose nothing: one that never calls, sends a malformed request, passes the model's
context or task.max_episode_tokens, calls more than task.max_turns times, runs past its deadline,
raises or returns no reward ends its episode with reward 0 and a counted error (``env/errors``,
``env/timeouts``: the guard's line past task.max_reward_error_frac), and the rest of the batch trains.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlpost.envs import env_spec, on_endpoint, verifiers_env
from rlpost.envs.agents import AgentPool
from rlpost.console import say
from rlpost.roles.endpoint import Endpoint, Limits, Record
from rlpost.roles.rollout_env import Episode, EpisodeRollout, assemble
from rlpost.types.batch import Rollouts


class AgentRollout(EpisodeRollout):
    """The rollout role for agent episodes, over a sampler (``sample_ids``) and a pool of agent workers."""

    # How long one wait on the agent workers may block before the endpoint is looked at again.
    POLL_S = 0.005

    def __init__(self, rollout, pool, endpoint: Endpoint):
        super().__init__(rollout, pool)
        self.endpoint = endpoint
        self.url = endpoint.start() if not endpoint.url else endpoint.url + "/v1"

    def close(self) -> None:
        self.pool.close()
        self.endpoint.stop()
        self.inner.close()

    def generate(self, rows: list[dict], n: int, temperature: float, top_p: float, max_new_tokens: int) -> Rollouts:
        """n episodes of each row, all at once; the sampling settings are the run's, whatever an agent asks."""
        ep = self.endpoint
        ep.forced, ep.limits.max_new_tokens = (temperature, top_p), max_new_tokens
        keys = []
        for i, row in enumerate(r for r in rows for _ in range(n)):
            key, url = ep.open(row)
            keys.append(key)
            self.pool.submit(i, {"op": "agent", "row": row, "base_url": url})
        episodes: list[Episode | None] = [None] * len(keys)
        decodes0, breaks = ep.decodes, 0
        while self.pool.pending():
            ep.step(running=self.pool.pending())
            for i, outcome in self.pool.poll(self.POLL_S):
                record = ep.close(keys[i])
                episodes[i] = self._ended(record, outcome)
                breaks += record.breaks
        while ep.step():  # calls of agents that ended meanwhile: refused, nothing waits on them
            pass
        self.last_metrics = {"agent/decode_calls": ep.decodes - decodes0, "agent/prefix_breaks": breaks}
        return assemble(episodes, rows, n, self.tok, self.version)

    def _ended(self, record: Record, outcome: tuple) -> Episode:
        """The episode from its record and what the agent's call came to."""
        e = record.episode
        turns = len(e.ends)
        if not e.prompt:
            e.prompt = [self.tok.pad_token_id]  # no call recorded: an empty completion, scored 0
        if outcome[0] == "ok":
            reply = outcome[1]
            why = (record.error or ("the agent made no call to the endpoint" if not record.calls else "")
                   or ("its calls did not continue one another (it rewrote its history?); none was recorded"
                       if not turns else "") or per_call(reply["rewards"], turns))
            if why:
                outcome = ("error", why)
            else:
                rewards = reply["rewards"]
                e.rewards = [0.0] * (turns - 1) + rewards if len(rewards) == 1 else list(rewards)
                e.correct = reply.get("correct")
                e.end("done")
                return e
        e.fail(outcome)
        kind = "timeout" if e.timeout else "error"
        text = (f"ran past its deadline of {self.pool.timeout_s:g} s (task.agent_timeout_s); it was killed"
                if e.timeout else e.error)
        if kind not in self.reported:  # the first of each kind said; the rest counted (env/errors, env/timeouts)
            self.reported.add(kind)
            say(f"{self.pool.name} failed (the first {kind}; later ones are only counted, in env/{kind}s): "
                f"{text}; the episode ended with reward 0")
        return e


def per_call(rewards: list[float], calls: int) -> str:
    """What is wrong with an agent's rewards for its recorded calls ('' when nothing)."""
    if len(rewards) in (1, calls):
        return ""
    return f"the agent returned {len(rewards)} rewards for {calls} recorded calls; expected one, or one per call"


def agent_rollout(rollout, task, context: int, run_dir: Path | None) -> AgentRollout:
    """The agent rollout for the task section over ``rollout`` (the model's ``context`` in tokens, 0:
    not known); its workers log to RUN/agent.log and import from the run folder and the current one."""
    workers = task.env_workers or min(8, os.cpu_count() or 1)
    path, factory = task.agent, None
    if on_endpoint(task):  # task.env=verifiers:ENV_ID: verifiers' own episode, on the endpoint
        path, factory = verifiers_env.AGENT, {**env_spec(task)[1], "max_turns": task.max_turns}
    pool = AgentPool(path, task.verifier, task.agent_timeout_s, workers=workers,
                     log_path=Path(run_dir) / "agent.log" if run_dir else None,
                     import_paths=(*((run_dir,) if run_dir else ()), os.getcwd()), factory=factory)
    if factory:
        pool.name = f"environment {task.env}"
    try:
        limits = Limits(max_new_tokens=1, context=context, max_calls=task.max_turns,
                        max_episode_tokens=task.max_episode_tokens)
        endpoint = Endpoint(rollout, limits)
        endpoint.admit = task.agent_join  # requests join a running decode (roles/endpoint.py: step)
        return AgentRollout(rollout, pool, endpoint)
    except BaseException:
        pool.close()
        raise
