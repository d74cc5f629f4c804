"""The environment worker process: imports the environment class (task.env), then runs episode
calls it is sent: ``rows``, ``reset`` and ``step`` (the contract: types/roles.py, Environment).

Why processes and not a thread pool. A step is the user's code; one that hangs can only be stopped
from outside if it runs in a process of its own (a thread cannot be killed, and a busy one would
keep taking the interpreter lock from the sampler's decode loop for the rest of the run). In a
process it also runs beside the decode on another core with no lock in common, and what it does to
memory (RLIMIT_AS), to its own process (os._exit, a segfault in a C extension) or to the processes
it starts (killed with its group) stays there. The price is that an environment crosses a pipe:
each call carries the episode's environment object (pickled with cloudpickle, which also takes
classes defined in a notebook or a script) and returns it changed, so the worker keeps nothing
between calls, any worker serves any episode, and killing a worker for a hang loses only the call
it was running.

It is started, timed, killed and restarted by the one worker pool (workers.py), as the verifier
workers are (rewards/worker.py), and talks over two private pipes, with fd 1 and 2 going to the
run's log. Replies are ``("ok", payload)`` or ``("error", message, traceback)``; what the
environment returned is checked here, so a reply that is not one of the shapes below is an error
of that call, not of the run. The step's info is made plain data here (an object becomes its
repr); the pool reads replies with no class allowed (wire.py), so an object of
the environment's module left anywhere else in a reply ends that call instead of importing the
module into the trainer.
"""

from __future__ import annotations

import json
import numbers
import sys
import traceback

import cloudpickle

from rlpost import wire
from rlpost.envs.data import ROLES
from rlpost.types.values import NotAFlag, NotAReward, checked_flags, reward_value
from rlpost.wire import import_object, plain

STYLES = ("chat", "inline")


class Garbage(Exception):
    """An environment returned something that is not what the contract says."""


def messages_of(value, what: str) -> list[dict]:
    """Chat messages from what reset or step returned: a list of {'role', 'content': str, ...}
    dicts, or a string (one user message)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, (list, tuple)):
        raise Garbage(f"{what} returned {type(value).__name__} for its messages, expected a list of message dicts or a "
                      "string")
    out = []
    for m in value:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise Garbage(f"{what} returned the message {str(m)[:80]!r}; expected a dict with a role in {ROLES} and "
                          "string content")
        out.append(dict(m))
    return out


def reward_of(value) -> float:
    """The turn's reward, checked as the loop holds it (types/values.py: finite in float32)."""
    try:
        return reward_value(value)
    except NotAReward as e:
        raise Garbage(f"step returned {e.shown} as its reward, expected {e.expected}") from None


def info_of(info: dict) -> dict:
    """step's info (plain data), with what rlpost reads of it checked: ``correct`` a boolean
    (types/values.py) and ``tool_calls`` a count."""
    try:
        info = checked_flags(info)
    except NotAFlag as e:
        raise Garbage(f"step returned {e}") from None
    calls = info.get("tool_calls")  # read as int(...) by the rollout: a string there was its traceback
    if calls is not None and (isinstance(calls, bool) or not isinstance(calls, numbers.Integral) or calls < 0):
        raise Garbage(f"step returned info['tool_calls'] = {repr(calls)[:60]}, expected a count (an int >= 0)")
    return info if calls is None else {**info, "tool_calls": int(calls)}


def step_of(value) -> dict:
    """What step returned, checked: (messages, reward, done) or (messages, reward, done, info)."""
    if not isinstance(value, tuple) or len(value) not in (3, 4):
        raise Garbage(f"step returned {type(value).__name__} {str(value)[:60]!r}; expected (messages, reward, done[, "
                      "info])")
    done, info = value[2], value[3] if len(value) == 4 else {}
    if not isinstance(done, bool):
        raise Garbage(f"step returned done={done!r}; expected True or False")
    if not isinstance(info, dict):
        raise Garbage(f"step returned info of type {type(info).__name__}; expected a dict")
    # info as plain data (an object becomes its repr, as a reward function's does): the trainer unpickles
    # replies with no class allowed (pool.py), so it never imports the environment's module
    return {"messages": messages_of(value[0], "step"), "reward": reward_of(value[1]), "done": done,
            "info": info_of(plain(info))}


def tools_of(tools) -> list[dict] | None:
    """The environment's tools as JSON schemas (Python functions converted as transformers does)."""
    if not tools:
        return None
    if callable(tools) or isinstance(tools, dict):
        tools = [tools]
    if any(callable(t) for t in tools):  # transformers only where needed: it costs a second of import
        from transformers.utils import get_json_schema

        tools = [get_json_schema(t) if callable(t) else t for t in tools]
    json.dumps(tools)  # a schema must be plain data: the parent renders it
    return list(tools)


def opening(env, row: dict) -> dict:
    messages = messages_of(env.reset(row), "reset")
    if not messages:  # the chat template has nothing to render, and the model nothing to answer
        raise Garbage("reset returned no messages; expected the opening messages (a list of message dicts, or a "
                      "string)")
    style, stop = getattr(env, "style", "chat"), list(getattr(env, "stop", []) or [])
    if style not in STYLES:
        raise Garbage(f"style={style!r}; expected one of {STYLES}")
    if not all(isinstance(s, str) and s for s in stop):
        raise Garbage(f"stop={stop!r}; expected a list of non-empty strings")
    return {"messages": messages, "tools": tools_of(getattr(env, "tools", None)), "style": style, "stop": stop}


def handle(cls, kwargs: dict, request: dict):
    """One call, its reply; any failure of the environment's code is an error reply."""
    try:
        if request["op"] == "rows":
            rows = getattr(cls(**kwargs), "rows", None)
            if rows is None:
                return ("ok", None)
            out = rows(request["split"], request["n"], request["seed"])
            if not isinstance(out, list) or not all(isinstance(r, dict) for r in out):
                raise Garbage(f"rows() returned {type(out).__name__}; expected a list of dicts")
            return ("ok", out)
        if request["op"] == "reset":
            env = cls(**kwargs)
            payload = opening(env, request["row"])
        else:
            env = cloudpickle.loads(request["env"])
            payload = step_of(env.step(request["message"]))
        return ("ok", {**payload, "env": cloudpickle.dumps(env)})
    except Garbage as e:  # rlpost's check of what the environment returned: a line, not our traceback
        print(f"environment: {e}", file=sys.stderr, flush=True)
        return ("error", str(e), "")
    except BaseException as e:  # noqa: BLE001 - any failure of the environment's code ends its episode, SystemExit too
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)  # every failure's traceback in the log
        return ("error", f"{type(e).__name__}: {e}", text)


def load(path: str, args: list[str]) -> tuple[tuple, str]:
    """The environment class and its keyword arguments (task.env_args, JSON on the command line)."""
    cls = import_object(path, "Class")
    if not callable(cls):
        raise TypeError(f"{path!r} is a {type(cls).__name__}, not a class")
    return (cls, json.loads(args[0])), "env"


def serve() -> None:
    """Entry point (workers.py starts it): the environment loaded, then its calls answered."""
    wire.serve(load, lambda loaded, request: handle(*loaded, request))
