"""The ``verifiers`` library's environments (``task.env=verifiers:ENV_ID``; ``pip install 'rlpost[verifiers]'``),
trained as their authors run them: on rlpost's OpenAI-compatible endpoint.

verifiers 0.4 (the environment library of prime-rl and its environment hub) packages an environment
as an installed taskset (``vf.Taskset`` of ``vf.Task`` rows with ``@vf.reward``, ``@vf.stop`` and
tools as ``vf.Toolset`` MCP servers), played by a harness program (a chat loop, an agent CLI) that
calls an OpenAI-compatible server through verifiers' interception server. Here each episode is an
agent episode (roles/rollout_agent.py: the one worker pool, its deadline task.agent_timeout_s, the
endpoint that records every call's tokens and log-probs): its worker runs verifiers' own episode
(``Env.run_slot``) with the client pointed at the episode's base URL, and the episode's reward is its
rubric's (the sum of the trainable traces' weighted rewards). An episode verifiers ends with an error
(a raising reward, a failed harness) is an error with reward 0, and the batch trains.

``task.env_args`` is verifiers' own env block (what ``vf-eval``'s ``--env.*`` flags set), as YAML:
``{taskset: {<its fields>}, agent: {harness: {id: bash}, max_turns: 8}}``. rlpost's defaults, where it
says nothing: the ``null`` harness (verifiers' chat program: the model and the taskset's tools, no
model-written code run), run on this interpreter (local_chat_program below), and the ``subprocess``
runtime (this machine, unsandboxed: verifiers' own default is a remote Prime sandbox), and
``agent.max_turns`` = task.max_turns. One key is rlpost's: ``heldout``, taskset fields that give the
held-out rows (``{heldout: {split: test}}``); without it the train and held-out rows are the two halves
of one shuffle of the taskset.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import random

AGENT = "rlpost.envs.verifiers_env:agent"  # the agent factory the agent workers load (envs/agents.py)
API_KEY_VAR = "RLPOST_VERIFIERS_KEY"  # the endpoint takes any key; verifiers' client wants one in the environment


def library():
    """verifiers 0.4's stack (``verifiers.v1``), or the line that says how to install it."""
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise ImportError(f"task.env=verifiers:ENV_ID needs verifiers 0.4 ({e}): pip install 'rlpost[verifiers]'"
                          ) from None
    return vf


def env_config(env_id: str, args: dict, split: str = "train", max_turns: int | None = None):
    """verifiers' env config for ``env_id`` and task.env_args, with rlpost's defaults."""
    vf = library()
    import pydantic  # verifiers' own dependency

    args = json.loads(json.dumps(args))  # a deep copy
    heldout = args.pop("heldout", None) or {}
    if not isinstance(heldout, dict):
        raise ValueError(f"task.env_args: heldout is taskset fields, a mapping like '{{split: test}}', got {heldout!r}")
    taskset = {**(args.pop("taskset", None) or {}), **(heldout if split == "heldout" else {}), "id": env_id}
    agent = args.pop("agent", None) or {}
    agent.setdefault("harness", {"id": "null"})
    agent.setdefault("runtime", {"type": "subprocess"})
    if max_turns:
        agent.setdefault("max_turns", max_turns)
    try:
        return vf.resolve_env_config({**args, "taskset": taskset, "agent": agent})
    except pydantic.ValidationError as e:  # one line naming what was wrong, not pydantic's block
        where = "task.env_args" + (" (with heldout's fields)" if split == "heldout" and heldout else "")
        raise ValueError(f"{where}: " + "; ".join(f"{'.'.join(map(str, x['loc'])) or 'its top level'}: {x['msg']} "
                                                  f"(got {x['input']!r})" for x in e.errors())) from None
    except ModuleNotFoundError as e:  # a harness named there that does not import (an unknown taskset is task.env's)
        message = str(e)
        if "harness" not in message.partition(" not found")[0]:
            raise
        known = message.partition("The built-in harnesses are: ")[2]
        raise ValueError(f"task.env_args: {message.partition('. ')[0]}" + (f"; verifiers has {known}" if known else "")
                         ) from None


@functools.lru_cache(maxsize=2)
def tasks(env_id: str, args: str, split: str) -> list:
    """The taskset's tasks, in its order (loaded once per worker process)."""
    vf = library()

    taskset = vf.load_environment(env_config(env_id, json.loads(args), split)).taskset
    if not taskset.bounded:
        raise ValueError(f"{env_id} is an infinite taskset; bound it in its config (task.env_args: taskset)")
    return list(taskset)


class VerifiersEnv:
    """The rows of an installed verifiers taskset (its episodes run as agents: ``agent`` below)."""

    def __init__(self, env_id: str, **env_args):
        self.env_id, self.args = env_id, json.dumps(env_args, sort_keys=True)

    def rows(self, split: str, n: int, seed: int) -> list[dict]:
        """Rows naming the taskset's tasks: the held-out ones from ``heldout``'s taskset, else a half of one shuffle."""
        separate = bool(json.loads(self.args).get("heldout"))
        loaded = tasks(self.env_id, self.args, split if separate else "train")
        order = list(range(len(loaded)))
        random.Random(seed).shuffle(order)
        if not separate and len(order) > 1:
            half = len(order) // 2
            order = order[half:] if split == "heldout" else order[:half]
        return [{"prompt": loaded[i].data.prompt_text, "vf_split": split if separate else "train", "vf_task": i}
                for i in order[:n]]


class Episodes:
    """A worker's verifiers environment, serving (its tool servers, its interception server) on an
    event loop of its own between episodes; called as an agent, ``(client, row) -> reward``."""

    def __init__(self, env_id: str, args: dict, max_turns: int):
        vf = library()

        self.vf, self.env_id, self.args = vf, env_id, json.dumps(args, sort_keys=True)
        os.environ.setdefault(API_KEY_VAR, "rlpost")
        local_chat_program()
        self.env = vf.load_environment(env_config(env_id, args, max_turns=max_turns))
        self.loop = asyncio.new_event_loop()
        self.serving = contextlib.AsyncExitStack()
        self.loop.run_until_complete(self.serving.enter_async_context(self.env.serving()))

    def __call__(self, client, row: dict) -> float:
        from verifiers.v1.env import RunSlot

        task = tasks(self.env_id, self.args, row["vf_split"])[row["vf_task"]]
        endpoint = self.vf.EvalClientConfig(base_url=str(client.base_url).rstrip("/"), api_key_var=API_KEY_VAR)
        ctx = self.vf.ModelContext(model="rlpost", client=endpoint)
        episode = self.loop.run_until_complete(self.env.run_slot(RunSlot(task), ctx))
        return reward(episode)

    def close(self) -> None:
        self.loop.run_until_complete(self.serving.aclose())
        self.loop.close()


def local_chat_program() -> None:
    """verifiers' chat program (the ``null`` and ``bash`` harnesses) runs on this interpreter, whose packages are
    verifiers' own and so the program's: verifiers would give it an environment of its own with uv, fetching uv
    itself from outside any package registry where it finds none, then the program's packages. Done by
    entering this interpreter in the subprocess runtime's table of prepared scripts (path -> interpreter),
    where its dependencies are installed here; other harnesses' programs go verifiers' way."""
    import hashlib
    import sys
    import tomllib
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM, CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    meta = tomllib.loads("\n".join(line[2:] for line in CHAT_PROGRAM.splitlines() if line.startswith("# ")
                                   and not line.startswith("# ///")))
    if not SpecifierSet(meta.get("requires-python", "")).contains(".".join(map(str, sys.version_info[:3]))):
        return
    for dep in map(Requirement, meta.get("dependencies", [])):
        try:
            if not dep.specifier.contains(version(dep.name), prereleases=True):
                return
        except PackageNotFoundError:
            return
    data = CHAT_PROGRAM_SOURCE.encode()
    path = Path(SubprocessRuntime.scripts_dir) / f"{hashlib.sha256(data).hexdigest()}.py"
    if not path.is_file() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        part.write_bytes(data)
        part.replace(path)  # whole, for the other workers that read it
    SubprocessRuntime._interpreters[str(path)] = sys.executable


def reward(episode) -> float:
    """The episode's reward: its trainable traces' rubric rewards; an episode that failed raises its error."""
    errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
    if not episode.ok or errors:
        first = errors[0] if errors else None
        raise RuntimeError(f"the verifiers episode failed: {first.type}: {first.message}" if first
                           else "the verifiers episode did not complete")
    return float(sum(t.reward for t in episode.traces if t.agent is None or t.agent.trainable))


def agent(env_id: str, max_turns: int = 0, **env_args) -> Episodes:
    """The agent factory of task.env=verifiers:ENV_ID (envs/agents.py loads it once per worker)."""
    return Episodes(env_id, env_args, max_turns)
