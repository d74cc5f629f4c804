"""The field's environment libraries as rlpost environments: TextArena (a single-player game), also
end to end through the RL loop on the tiny model (verifiers: tests/envs/test_verifiers.py)."""

import json

import pytest
from helpers import tiny_cfg

from rlpost.recipes.rl import train

pytest.importorskip("textarena", reason="pip install 'rlpost[textarena]'")


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
    # as a verifiers id is (tests/envs/test_verifiers.py): one line and exit 2 before the run folder exists, not a
    # failure at step 1 after the first evaluation, with a folder left behind
    from helpers import TINY, cli

    r = cli("train", *TINY, "task.name=env", f"task.env={env}", "task.n_heldout=2", f"run.out_dir={tmp_path}")
    assert r.returncode == 2 and expected in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("rlpost: error: task.env: ") and "Traceback" not in r.stderr
    assert not any(tmp_path.iterdir())
