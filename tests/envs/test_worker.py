"""The environment worker's checks of what an environment returns (envs/worker.py), called in this
process: a reward as the loop holds it (float32), the info keys rlpost reads, reset's messages; and
through the CLI, one line naming the environment, no traceback."""

import numpy
import pytest
import toy_envs
from helpers import TINY, cli, verifier_workers

from rlpost.envs.worker import handle


def step(reply: tuple, fault: str = "") -> tuple:
    """(outcome kind, message or payload) of the Faulty environment's first step with ``fault``."""
    opened = handle(toy_envs.Faulty, {}, {"op": "reset", "row": {"fault": fault}})
    assert opened[0] == "ok", opened
    return handle(toy_envs.Faulty, {}, {"op": "step", "env": opened[1]["env"], "message": reply})


MESSAGE = {"role": "assistant", "content": "x"}


@pytest.mark.parametrize("fault,said", [
    ("nan", "step returned nan as its reward, expected a finite number"),
    ("past_float32", "step returned 1e+39 as its reward, expected a finite number in float32, the type rewards are "
                     "held in (|reward| <= 3.4e38)"),
    ("correct_as_text", "step returned info['correct'] = 'no' (a str), expected True or False"),
    ("tool_calls_as_text", "step returned info['tool_calls'] = 'two', expected a count (an int >= 0)"),
])
def test_what_a_step_returns_is_checked_in_one_line(fault, said):
    # rlpost's own check: the message alone, no traceback (which would show the worker's frames)
    assert step(MESSAGE, fault) == ("error", said, "")


def test_a_step_within_float32_and_with_boolean_flags_passes():
    kind, payload = step(MESSAGE)
    assert kind == "ok" and payload["reward"] == 1.0 and payload["info"] == {"correct": False, "tool_calls": 1}


def test_info_flags_take_numpy_bools_and_refuse_the_rest():
    from rlpost.types.values import NotAFlag, checked_flags

    out = checked_flags({"correct": numpy.bool_(True), "other": "no"})
    assert out == {"correct": True, "other": "no"} and type(out["correct"]) is bool
    for bad in ("no", 1, 0.0, None, numpy.int64(1)):
        with pytest.raises(NotAFlag, match=r"^info\['correct'\] = "):
            checked_flags({"correct": bad})


def test_a_reset_with_no_messages_is_one_line():
    assert handle(toy_envs.EmptyReset, {}, {"op": "reset", "row": {}}) == (
        "error", "reset returned no messages; expected the opening messages (a list of message dicts, or a string)",
        "")


@pytest.mark.parametrize("env,said", [
    ("toy_envs:EmptyReset", "reset returned no messages"),
    ("toy_envs:Faulty", "step returned info['correct'] = 'no' (a str), expected True or False"),
])
def test_an_environment_returning_garbage_is_one_line_through_the_cli(tmp_path, env, said):
    # reset() returning [] reached the chat template in the trainer (transformers' ValueError, a
    # traceback); info['correct'] = 'no' counted as correct. Now: the environment's line, and the
    # guard stops the run (every episode of the first batch failed)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "p", "fault": "correct_as_text"}\n' * 8)
    r = cli("train", *TINY, "task.name=env", f"task.env={env}", f"task.data={rows}", "task.n_heldout=2",
            "task.env_workers=1", f"run.out_dir={tmp_path}", "run.name=e")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert f"environment {env} failed (the first error; " in r.stderr and said in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1].startswith("rlpost: error: "), r.stderr[-3000:]
    assert verifier_workers() == []
