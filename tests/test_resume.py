"""Exact resume: SIGKILL after step k, resume, and end where the uninterrupted run ends."""

import json
import signal

import torch
from helpers import TINY, run_cli, run_cli_killed_after
from safetensors.torch import load_file

ARGS = [*TINY, "run.steps=5", "run.checkpoint_every=2", "run.keep_checkpoints=2", "trainer.epochs=2",
        "trainer.mini_batch_size=8", "trainer.micro_batch_size=4", "algo.kl_coef=0.05", "trainer.warmup_steps=2",
        "trainer.schedule=cosine", "task.verifier=toy_verifiers:odd_length"]


def metric_lines(run):
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        out.append({k: v for k, v in m.items() if not k.startswith(("timing_s/", "perf/"))})
    return out


def test_sigkill_then_resume_is_exact(tmp_path):
    full = run_cli("train", *ARGS, f"run.out_dir={tmp_path}", "run.name=full")
    assert full.returncode == 0, full.stderr[-3000:]
    # Killed after step 3: the last checkpoint is step 2, and step 3's metric line must be discarded.
    killed = run_cli_killed_after(3, "train", *ARGS, f"run.out_dir={tmp_path}", "run.name=cut")
    assert killed.returncode == -signal.SIGKILL
    assert len((tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()) == 3
    resumed = run_cli("train", "--resume", str(tmp_path / "cut"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = load_file(tmp_path / "full" / "checkpoints" / "step_000005" / "model.safetensors")
    b = load_file(tmp_path / "cut" / "checkpoints" / "step_000005" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert metric_lines(tmp_path / "full") == metric_lines(tmp_path / "cut")
    sa = json.loads((tmp_path / "full" / "summary.json").read_text())
    sb = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert sa["heldout_accuracy_before"] == sb["heldout_accuracy_before"]
    assert sa["heldout_accuracy_after"] == sb["heldout_accuracy_after"]


def test_new_run_refuses_to_overwrite_checkpoints(tmp_path):
    ok = run_cli("train", *TINY, "run.steps=1", f"run.out_dir={tmp_path}", "run.name=x")
    assert ok.returncode == 0, ok.stderr[-2000:]
    again = run_cli("train", *TINY, "run.steps=1", f"run.out_dir={tmp_path}", "run.name=x")
    assert again.returncode == 2 and "--resume" in again.stderr


def test_reinforce_baseline_state_survives_resume(tmp_path):
    args = [*TINY, "run.steps=3", "run.checkpoint_every=1", "algo.name=reinforce", "task.verifier=toy_verifiers:odd_length"]
    full = run_cli("train", *args, f"run.out_dir={tmp_path}", "run.name=full")
    killed = run_cli_killed_after(2, "train", *args, f"run.out_dir={tmp_path}", "run.name=cut")
    assert full.returncode == 0 and killed.returncode == -signal.SIGKILL, full.stderr[-2000:]
    resumed = run_cli("train", "--resume", str(tmp_path / "cut"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert metric_lines(tmp_path / "full") == metric_lines(tmp_path / "cut")  # includes critic/baseline


def test_ppo_critic_and_adaptive_kl_survive_resume(tmp_path):
    # The critic's weights and optimizer state, and the adapted KL coefficient, are run state too.
    args = [*TINY, "run.steps=3", "run.checkpoint_every=1", "algo.name=ppo", "algo.kl_coef=0.1",
            "algo.kl_target=1e-4", "algo.critic_lr=1e-3", "trainer.epochs=2", "trainer.mini_batch_size=8",
            "task.verifier=toy_verifiers:odd_length"]
    full = run_cli("train", *args, f"run.out_dir={tmp_path}", "run.name=full")
    killed = run_cli_killed_after(2, "train", *args, f"run.out_dir={tmp_path}", "run.name=cut")
    assert full.returncode == 0 and killed.returncode == -signal.SIGKILL, full.stderr[-2000:]
    resumed = run_cli("train", "--resume", str(tmp_path / "cut"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    lines = metric_lines(tmp_path / "full")
    assert lines == metric_lines(tmp_path / "cut")  # includes critic/vpred_mean and actor/kl_coef
    coefs = [m["actor/kl_coef"] for m in lines]
    # Step 1 samples from the reference itself (KL 0 < target): the coefficient falls, by
    # 0.2 * 16 / 10000 = 0.032%; once the policy has moved (KL > target) it rises again.
    assert abs(coefs[0] - 0.1 * (1 - 0.2 * 16 / 10000)) < 1e-9
    assert coefs[2] > coefs[1] > coefs[0]
