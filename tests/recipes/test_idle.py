"""Runs that train nothing (recipes/idle.py): every way a step can leave the policy as it was is
counted, named with its knob in the run's last line, and the run still writes RUN/model (the
unchanged policy) and summary.json; `rlpost train` exits 0 (it ran as asked; summary.json says steps_trained 0)."""

import json

import torch
from helpers import TINY, cli
from safetensors.torch import load_file

from rlpost import config
from rlpost.model.load import load_policy
from rlpost.recipes import idle, rl


def unchanged(run_dir, cfg) -> bool:
    """RUN/model holds the starting policy's weights, bit for bit."""
    start = load_policy(cfg.model.name, dtype=torch.float32, seed=cfg.run.seed).model.state_dict()
    saved = load_file(run_dir / "model" / "model.safetensors")
    return bool(saved) and all(torch.equal(start[k], v) for k, v in saved.items())


def test_dapo_with_no_group_left_says_so_and_writes_the_model(tmp_path):
    # The tiny random model never solves arithmetic: every group all-fail, DAPO's filter keeps none.
    r = cli("train", *TINY, "algo.name=dapo", "rollout.max_refill_rounds=0", f"run.out_dir={tmp_path}", "run.name=d")
    run = tmp_path / "d"
    assert r.returncode == 0, r.stderr
    assert ("trained nothing: none of the 2 steps changed the policy: 2 steps kept no group after the group filter"
            in r.stderr)
    assert "rollout.max_refill_rounds=0 refills" in r.stderr and "no checkpoint" not in r.stderr
    assert r.stderr.splitlines()[-1].startswith("rlpost: trained nothing")  # the run's last word
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps_trained"] == 0 and summary["steps_idle"] == {"filtered": 2}
    assert unchanged(run, config.load(run / "config.yaml"))


def test_equal_rewards_everywhere_train_nothing_and_the_model_is_the_start(tmp_path):
    r = cli("train", *TINY, "task.verifier=toy_verifiers:half", f"run.out_dir={tmp_path}", "run.name=h")
    assert r.returncode == 0, r.stderr
    assert "2 steps had every group's rewards equal (every advantage 0)" in r.stderr
    assert "rollout.group_size (now 4)" in r.stderr
    summary = json.loads((tmp_path / "h" / "summary.json").read_text())
    assert summary["steps_idle"] == {"no_signal": 2} and (tmp_path / "h" / "report.html").exists()
    assert unchanged(tmp_path / "h", config.load(tmp_path / "h" / "config.yaml"))


def test_every_optimizer_step_non_finite_below_the_streak_limit_is_counted(tmp_path):
    from rlpost import build

    def nan_loss(*a, **k):
        roles = build.build_roles(*a, **k)
        loss = roles.algo.loss
        roles.algo.loss = lambda logp, batch, **kw: (loss(logp, batch, **kw)[0] * float("nan"), {})
        return roles

    cfg = config.load(None, [*TINY, "task.verifier=toy_verifiers:odd_length", "trainer.max_nonfinite_steps=3"])
    summary = rl.train(cfg, tmp_path, make_roles=nan_loss)
    assert summary["steps_trained"] == 0 and summary["steps_idle"] == {"nonfinite": 2}
    assert unchanged(tmp_path, cfg)


def test_reward_calls_that_all_fail_within_the_error_bar_are_counted_with_its_knob(tmp_path, monkeypatch, capsys):
    # step 1 scores (odd length: rewards differ, it trains); from step 2 on every call raises, scored 0, and
    # task.max_reward_error_frac=1 lets the run go on: steps 2 and 3 learn nothing. The service is back for the
    # final held-out evaluation (a reward that fails on every held-out completion stops the run: recipes/guard.py).
    marker = tmp_path / "down"
    monkeypatch.setenv("RLPOST_TEST_FAIL_MARKER", str(marker))
    cfg = config.load(None, [*TINY, "task.verifier=toy_verifiers:fails_once_marked", "task.verifier_workers=1",
                             "task.max_reward_error_frac=1", "run.steps=3"])
    summary = rl.train(cfg, tmp_path / "run", on_step_end=lambda step: marker.touch() if step < 3 else marker.unlink())
    assert summary["steps_trained"] == 1 and summary["steps_idle"] == {"reward_failed": 2}
    err = capsys.readouterr().err
    assert "2 of 3 steps trained nothing: 2 steps scored every completion 0 because every reward call failed, which " \
           "task.max_reward_error_frac=1 let through" in err


def test_cause_reads_each_signal_and_a_gradient_anywhere_means_trained():
    assert idle.cause({"rollout/groups_trained": 0}) == "filtered"
    assert idle.cause({"actor/optimizer_steps": 0, "actor/grad_norm": float("nan")}) == "nonfinite"
    assert idle.cause({"actor/optimizer_steps": 1, "actor/grad_norm": 0.0}) == "no_signal"
    # PPO's critic
    assert idle.cause({"actor/optimizer_steps": 1, "actor/grad_norm": 0.0, "critic/grad_norm": 0.3}) is None
    assert idle.cause({"actor/optimizer_steps": 1, "actor/grad_norm": 1e-9}) is None  # a KL or entropy term
    failed = {"verifier/f/calls": 8, "verifier/f/errors": 5, "verifier/f/timeouts": 3, "verifier/errors": 5}
    assert idle.cause({"actor/optimizer_steps": 1, "actor/grad_norm": 0.0, **failed}) == "reward_failed"
    assert (idle.cause({"actor/optimizer_steps": 1, "actor/grad_norm": 0.0, **failed, "verifier/f/timeouts": 2})
            == "no_signal")
    assert idle.cause({"rollout/groups_trained": 2, "actor/optimizer_steps": 1, "actor/grad_norm": 0.5}) is None


def test_the_zero_gradient_advice_follows_the_algorithm_and_the_task():
    grpo = config.load(None, ["rollout.group_size=4"])
    assert "raise rollout.group_size (now 4)" in idle.explain("no_signal", 2, grpo)
    ppo = config.load(None, ["algo.name=ppo", "rollout.group_size=1"])  # a critic, no group: no group knob
    text = idle.explain("no_signal", 2, ppo)
    assert "group_size" not in text and "group's rewards" not in text and "rollout.temperature" in text
    env = config.load(None, ["task.name=env", "task.env=textarena:TicTacToe-v0"])
    assert "an environment this model wins sometimes" in idle.explain("no_signal", 1, env)
    assert "rlpost eval" not in idle.explain("no_signal", 1, env)
