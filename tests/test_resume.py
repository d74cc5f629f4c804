"""Exact resume: stopped after step k and resumed, a run ends where the uninterrupted run ends.

One run is SIGKILLed at the worst moment (a subprocess: the kill is the point); the rest stop by an
exception from the loop's on_step_end hook, in this process, which costs no start-up."""

import json
import signal

import pytest
import torch
from helpers import TINY, cli, run_cli_killed_after, tiny_cfg
from safetensors.torch import load_file

from rlpost import build
from rlpost.algorithms import ALGORITHMS
from rlpost.recipes import rl
from rlpost.recipes.rl import train

ARGS = [*TINY, "run.steps=5", "run.checkpoint_every=2", "run.keep_checkpoints=2", "trainer.epochs=2",
        "trainer.mini_batch_size=8", "trainer.micro_batch_size=4", "algo.kl_coef=0.05", "trainer.warmup_steps=2",
        "trainer.schedule=cosine", "task.verifier=toy_verifiers:odd_length"]


def metric_lines(run):
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        out.append({k: v for k, v in m.items() if not k.startswith(("timing_s/", "perf/"))})
    return out


def same_weights(a, b, step):
    wa = load_file(a / "checkpoints" / f"step_{step:06d}" / "model.safetensors")
    wb = load_file(b / "checkpoints" / f"step_{step:06d}" / "model.safetensors")
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_sigkill_then_resume_is_exact(tmp_path):
    full = cli("train", *ARGS, f"run.out_dir={tmp_path}", "run.name=full")
    assert full.returncode == 0, full.stderr[-3000:]
    # Killed after step 3: the last checkpoint is step 2, and step 3's metric line must be discarded.
    killed = run_cli_killed_after(3, "train", *ARGS, f"run.out_dir={tmp_path}", "run.name=cut")
    assert killed.returncode == -signal.SIGKILL
    assert len((tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()) == 3
    resumed = cli("train", "--resume", str(tmp_path / "cut"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert same_weights(tmp_path / "full", tmp_path / "cut", 5)
    assert metric_lines(tmp_path / "full") == metric_lines(tmp_path / "cut")
    sa = json.loads((tmp_path / "full" / "summary.json").read_text())
    sb = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert sa["heldout_accuracy_before"] == sb["heldout_accuracy_before"]
    assert sa["heldout_accuracy_after"] == sb["heldout_accuracy_after"]


def test_new_run_refuses_to_overwrite_checkpoints(tmp_path):
    ok = cli("train", *TINY, "run.steps=1", f"run.out_dir={tmp_path}", "run.name=x")
    assert ok.returncode == 0, ok.stderr[-2000:]
    again = cli("train", *TINY, "run.steps=1", f"run.out_dir={tmp_path}", "run.name=x")
    assert again.returncode == 2 and f"use --resume {tmp_path / 'x'}" in again.stderr


class Stop(Exception):
    """Raised by on_step_end: the run stops right after a step's checkpoint, as a crash would."""


def stopped_after(cfg, run_dir, step: int) -> None:
    made = []

    def make_roles(*a, **k):  # keep the roles, to close their worker processes after the stop
        made.append(build.build_roles(*a, **k))
        return made[-1]

    def stop(s):
        if s == step:
            raise Stop

    try:
        with pytest.raises(Stop):
            train(cfg, run_dir, on_step_end=stop, make_roles=make_roles)
    finally:
        for roles in made:
            roles.close()


# Each algorithm's own state (REINFORCE's baseline, PPO's critic and adapted KL coefficient), with
# 2 epochs x 2 mini-batches where a ratio exists, and a KL term where one exists.
def resume_cfg(name: str):
    traits = ALGORITHMS[name].traits
    extra = [] if traits.on_policy_only else ["trainer.epochs=2", "trainer.mini_batch_size=8"]
    extra += [] if traits.kl == "none" else ["algo.kl_coef=0.1", "algo.kl_target=1e-4"]
    extra += ["algo.critic_lr=1e-3"] if traits.needs_values else []
    extra += ["algo.teacher=tiny"] if traits.teacher else []  # distill: the tiny model's own copy as teacher
    return tiny_cfg(f"algo.name={name}", "run.steps=3", "run.checkpoint_every=1",
                    "task.verifier=toy_verifiers:odd_length", *extra)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_resumes_exactly(tmp_path, name):
    cfg = resume_cfg(name)
    train(cfg, tmp_path / "full")
    stopped_after(cfg, tmp_path / "cut", 2)
    assert len(metric_lines(tmp_path / "cut")) == 2
    train(cfg, tmp_path / "cut", resume=True)
    lines = metric_lines(tmp_path / "full")
    assert lines == metric_lines(tmp_path / "cut")  # includes critic/baseline, critic/vpred_mean, actor/kl_coef
    assert same_weights(tmp_path / "full", tmp_path / "cut", 3)
    if ALGORITHMS[name].traits.kl == "reward":
        coefs = [m["actor/kl_coef"] for m in lines]
        # Step 1 samples from the reference itself and measures the KL in the reward under those
        # weights (KL 0 < target): the coefficient falls, by 0.2 * 16 / 10000 = 0.032%; once the
        # policy has moved (KL > target) it rises again.
        assert abs(coefs[0] - 0.1 * (1 - 0.2 * 16 / 10000)) < 1e-9 and coefs[2] > coefs[1] > coefs[0]
    if name == "reinforce":  # the moving baseline: 0 before the first batch, then moving
        assert lines[0]["critic/baseline"] == 0.0 and lines[1]["critic/baseline"] == lines[0]["reward/mean"]


def test_ppo_critic_and_adaptive_kl_survive_resume(tmp_path):
    # The fast representative of the test above: a critic, 2 epochs x 2 mini-batches, adaptive KL.
    test_every_algorithm_resumes_exactly(tmp_path, "ppo")


def test_a_mixed_stream_resumes_exactly_in_the_loop(tmp_path, monkeypatch):
    # task.mix with the curriculum on: the checkpoint holds the draw counter and each family's stream
    # (position, pass-rate record), so step 2 after a stop at step 1 samples the very prompts of the
    # uninterrupted run (its samples file) and logs the same per-family shares. (No HTML report: it
    # is most of a tiny run's time, and not what this checks.)
    monkeypatch.setattr(rl, "write_report", lambda run_dir: run_dir / "report.html")
    cfg = tiny_cfg("task.mix=arithmetic:0.3,math:0.7", "run.checkpoint_every=1", "rollout.curriculum_window=1",
                   "task.n_train=6", "task.n_heldout=1", "task.verifier_workers=1")
    train(cfg, tmp_path / "full")
    stopped_after(cfg, tmp_path / "cut", 1)
    train(cfg, tmp_path / "cut", resume=True)
    assert metric_lines(tmp_path / "full") == metric_lines(tmp_path / "cut")
    prompts = [[json.loads(x)["prompt"] for x in (run / "samples" / "step_000002.jsonl").read_text().splitlines()]
               for run in (tmp_path / "full", tmp_path / "cut")]
    assert prompts[0] == prompts[1] and len(prompts[0]) == 16
    assert any(k.startswith("mix/share/") for k in metric_lines(tmp_path / "full")[1])
