"""Agents by import path (``task.name=agent task.agent=module:fn``): the worker processes that run
them, and what an agent's return value means.

An agent is ``fn(client, row)``, where ``client`` is an ``openai.OpenAI`` whose base URL is its
episode's on the run's endpoint (roles/endpoint.py). It returns one of:

* a number: the episode's reward, given to its last call;
* a list of numbers, one per call it made, in order: per-call rewards (task.turn_credit=turn);
* a transcript (a string, or a list of chat messages whose last assistant message is read), which
  task.verifier scores as it scores a completion: ``verifier(text, row) -> reward | (reward, info)``;
* a dict ``{"reward": ..., "correct": bool}`` (or ``"rewards"``), when correctness is not reward >= 1.

Why processes: an agent is the user's code and makes blocking HTTP calls; in a worker of the one
pool (workers.py) it runs beside the sampler with no interpreter lock in common, its deadline
(task.agent_timeout_s, the whole episode) is enforced by killing it with what it started, and a
crash, a hang or a leak ends its episode only. A worker runs one episode at a time, so
task.env_workers workers run that many episodes at once; their calls meet in the endpoint's batches.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from rlpost import wire
from rlpost.types.values import NotAFlag, NotAReward, checked_flags, reward_value
from rlpost.wire import import_object
from rlpost.workers import WorkerPool

# Importing openai and the agent's own libraries (LangGraph, smolagents) can take seconds: start-up, given once.
IMPORT_GRACE_S = 60.0


class AgentPool(WorkerPool):
    """Worker processes running ``fn(client, row)`` episodes, each with the episode's deadline."""

    def __init__(self, path: str, verifier: str, timeout_s: float, *, workers: int = 1,
                 log_path: str | Path | None = None, import_paths: tuple = (), factory: dict | None = None):
        # factory: ``path`` names a factory, called once per worker with these keyword arguments, that gives the
        # agent (envs/verifiers_env.py: a verifiers environment loaded and serving)
        super().__init__("rlpost.envs.agents", path, timeout_s, what="agent worker",
                         key="task.env" if factory is not None else "task.agent",
                         workers=workers, log_path=log_path, grace_s=IMPORT_GRACE_S,
                         import_paths=(*map(str, import_paths), *(p for p in sys.path if p)),
                         args=(json.dumps({"verifier": verifier, "factory": factory}),))
        self.name = f"agent {path}"  # what the rollout's lines call it


class Garbage(Exception):
    """An agent returned something that is not a reward, rewards or a transcript."""


def reward_of(value, what: str) -> float:
    try:
        return reward_value(value)
    except NotAReward as e:
        raise Garbage(f"{what} is {e.shown}, expected {e.expected}") from None


def transcript_text(value) -> str | None:
    """The text a verifier scores: the string, or the last assistant message's content (None: not a transcript)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        said = [m.get("content") for m in value if m.get("role") == "assistant"]
        return str(said[-1] or "") if said else ""
    return None


def result_of(value, verifier, row: dict) -> dict:
    """What the agent returned, as {'rewards': [float, ...], 'correct': bool | None}."""
    correct = None
    if isinstance(value, dict) and ("reward" in value or "rewards" in value):
        try:
            correct = checked_flags({"correct": value["correct"]})["correct"] if "correct" in value else None
        except NotAFlag as e:
            raise Garbage(f"the agent returned {e}") from None
        value = value.get("rewards", value.get("reward"))
    text = transcript_text(value) if verifier is not None else None
    if text is not None:
        scored = verifier(text, row)
        reward, info = scored if isinstance(scored, tuple) and len(scored) == 2 else (scored, {})
        try:
            flags = checked_flags(dict(info or {}))
        except (NotAFlag, TypeError, ValueError) as e:
            raise Garbage(f"task.verifier returned the info {str(info)[:60]!r} ({e})") from None
        return {"rewards": [reward_of(reward, "task.verifier's reward")], "correct": flags.get("correct")}
    if isinstance(value, (list, tuple)) and not isinstance(value, str):
        if not value:
            raise Garbage("the agent returned an empty list; expected a reward, one per call, or a transcript")
        return {"rewards": [reward_of(v, f"reward {k}") for k, v in enumerate(value)], "correct": correct}
    if isinstance(value, str) or (isinstance(value, list) and verifier is None):
        raise Garbage("the agent returned a transcript, and there is no task.verifier to score it")
    return {"rewards": [reward_of(value, "the agent's reward")], "correct": correct}


def handle(loaded, request: dict):
    """One episode: the agent run against its client; any failure of its code is an error reply."""
    fn, verifier, openai = loaded
    try:
        client = openai.OpenAI(base_url=request["base_url"], api_key="rlpost", max_retries=0,
                               timeout=request["cpu_s"])
        return ("ok", result_of(fn(client, request["row"]), verifier, request["row"]))
    except Garbage as e:
        print(f"agent: {e}", file=sys.stderr, flush=True)
        return ("error", str(e), "")
    except BaseException as e:  # noqa: BLE001 - any failure of the agent ends its episode, SystemExit too
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        return ("error", f"{type(e).__name__}: {e}", text)


def load(path: str, args: list[str]):
    """The agent function, task.verifier's (if any) and the openai module: a missing one is the dry start's line."""
    try:
        import openai
    except ImportError:
        raise ImportError("the agent's client needs openai: pip install 'rlpost[agents]'") from None
    fn = import_object(path, "function")
    if not callable(fn):
        raise TypeError(f"{path!r} is a {type(fn).__name__}, not a function")
    settings = json.loads(args[0])
    if settings.get("factory") is not None:
        fn = fn(**settings["factory"])
    name = settings.get("verifier")
    return (fn, import_object(name, "function") if name else None, openai), "agent"


def serve() -> None:
    """Entry point (workers.py starts it): the agent loaded, then its episodes run."""
    wire.serve(load, handle)
