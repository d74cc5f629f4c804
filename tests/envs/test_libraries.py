"""The field's environment libraries as rlpost environments: verifiers (its single-turn, multi-turn
and tool environments, loaded by name, scored by their rubric) and TextArena (a single-player
game), each also end to end through the RL loop on the tiny model."""

import json

import pytest
from helpers import tiny_cfg

from rlpost.recipes.rl import train

pytest.importorskip("verifiers", reason="pip install 'rlpost[verifiers]'")
pytest.importorskip("textarena", reason="pip install 'rlpost[textarena]'")


def call(name, **arguments):
    return {"id": "call_0", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


@pytest.mark.slow  # ~10 s: importing verifiers
def test_verifiers_environments_run_turn_by_turn_and_their_rubric_is_the_reward():
    from rlpost.envs.verifiers_env import VerifiersEnv

    single = VerifiersEnv("vf_toy", kind="single")
    row = single.rows("train", 1, 0)[0]
    assert single.reset(row) == [{"role": "user", "content": row["question"]}] and single.tools is None
    assert single.step({"role": "assistant", "content": f"{row['answer']}"}) == ([], 1.0, True, {"tool_calls": 0})
    multi = VerifiersEnv("vf_toy", kind="multi")
    multi.reset(row)
    # its env_response answers a wrong answer, replayed from the start at each step
    assert multi.step({"role": "assistant", "content": "no idea"}) == ([{"role": "user", "content": "Try again."}],
                                                                        0.0, False,
                                                                        {"tool_calls": 0})
    assert multi.step({"role": "assistant", "content": f"{row['answer']}"})[1:3] == (1.0, True)
    tool = VerifiersEnv("vf_toy", kind="tool")
    tool.reset(row)
    assert [t["function"]["name"] for t in tool.tools] == ["add"]  # its Python function as a JSON schema
    messages, reward, done, info = tool.step({"role": "assistant", "content": "",
                                              "tool_calls": [call("add", a=2, b=3)]})
    assert messages == [{"role": "tool", "content": "5", "tool_call_id": "call_0"}]
    assert not done and info["tool_calls"] == 1
    assert tool.step({"role": "assistant", "content": "I do not know"})[1:3] == (0.0, True)  # no call ends a ToolEnv
    train_rows, held = single.rows("train", 100, 0), single.rows("heldout", 100, 0)
    # no eval dataset: halves of one shuffle
    assert not {r["question"] for r in train_rows} & {r["question"] for r in held}


@pytest.mark.slow  # ~40 s: two workers import verifiers, then a tiny-model run
def test_a_verifiers_tool_environment_trains_end_to_end_on_the_tiny_model(tmp_path):
    cfg = tiny_cfg("task.name=env", "task.env=verifiers:vf_toy", "task.env_args={kind: tool}", "task.env_workers=1",
                   "task.n_train=8", "task.n_heldout=4", "run.steps=1", "task.max_turns=2")
    summary = train(cfg, tmp_path / "run")
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["env/episodes"] == 16 and metrics["env/errors"] == 0 and metrics["env/timeouts"] == 0
    assert 1 <= metrics["env/turns_mean"] <= 2 and 0 <= summary["heldout_accuracy_after"] <= 1


def test_a_textarena_game_is_an_environment():
    from rlpost.envs.textarena_env import TextArenaEnv

    env = TextArenaEnv("GuessTheNumber-v0")
    train_rows, held = env.rows("train", 50, 0), env.rows("heldout", 50, 0)
    assert not {r["seed"] for r in train_rows} & {r["seed"] for r in held}
    opening = env.reset(train_rows[0])
    assert "Guess The Number" in opening[0]["content"] and opening[0]["role"] == "user"
    messages, reward, done, _ = env.step({"role": "assistant", "content": "My guess is [10]."})
    assert not done and reward == 0
    assert messages[0]["content"] in ("The target number is higher.", "The target number is lower.")
    low, high = (11, 20) if "higher" in messages[0]["content"] else (1, 9)
    for guess in range(low, high + 1):  # the game's own reward when it ends
        messages, reward, done, info = env.step({"role": "assistant", "content": f"[{guess}]"})
        if done:
            break
    assert done and reward > 0 and info["correct"]


@pytest.mark.slow  # ~20 s: a tiny-model run
def test_a_textarena_game_trains_end_to_end_on_the_tiny_model(tmp_path, capsys, monkeypatch):
    from rlpost import console

    monkeypatch.setattr(console, "_said", set())  # said once a process: as if this run were the first
    # the tiny model's tokenizer has a token per character: the game's rules alone are ~500 tokens, past its
    # 256-token context (rotary: it runs there), which is said once; 4x past it would stop the run
    cfg = tiny_cfg("task.name=env", "task.env=textarena:GuessTheNumber-v0", "task.n_train=8", "task.n_heldout=4",
                   "run.steps=1", "task.max_turns=3", "task.max_episode_tokens=4000")
    summary = train(cfg, tmp_path / "run")
    said = [line for line in capsys.readouterr().err.splitlines() if "opening past the model's context" in line]
    assert len(said) == 1 and "the model takes 256 tokens" in said[0], said
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["env/episodes"] == 16 and metrics["env/errors"] == 0
    # a random model writes no '[number]': the game ends itself after its second invalid move, with reward 0
    assert metrics["env/turns_mean"] == 2 and metrics["env/done_frac"] == 1 and metrics["reward/mean"] == 0
    assert summary["heldout_accuracy_after"] == 0


@pytest.mark.parametrize("env, expected", [
    ("textarena:GuessTheNumbr-v0", "no TextArena game 'GuessTheNumbr-v0'; did you mean GuessTheNumber-v0"),
    ("textarena:TicTacToe-v0", "rlpost plays single-player TextArena games"),
])
def test_a_textarena_id_is_checked_at_start_with_no_run_folder_left(tmp_path, env, expected):
    # as a verifiers id is: one line and exit 2 before the run folder exists, not a failure at step 1 after the
    # first evaluation, with a folder left behind
    from helpers import TINY, cli

    r = cli("train", *TINY, "task.name=env", f"task.env={env}", "task.n_heldout=2", f"run.out_dir={tmp_path}")
    assert r.returncode == 2 and expected in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("rlpost: error: task.env: ") and "Traceback" not in r.stderr
    assert not any(tmp_path.iterdir())
