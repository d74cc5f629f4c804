"""Every kind of run writes a checkpoint its own resume reads back through the read-back schemas
(model/checkpoint.py: STATE, TRAINER; the streams' own): the schemas are checked against what the
writers write, not against a hand-made state. A schema that disagrees with a writer makes every
checkpoint of that kind "corrupt" (trainer.pt's float32 masters, a list, were once declared a
mapping): resume and export then fail."""

import pytest
from helpers import tiny_cfg

from rlpost.model import checkpoint
from rlpost.recipes import rl
from rlpost.recipes.rl import train

ODD = "task.verifier=toy_verifiers:odd_length"
KINDS = {
    # LoRA adapters, a critic, float32 masters of the bf16 weights and adaptive KL, in one run
    "lora ppo bf16 masters": ["model.lora_r=4", "algo.name=ppo", "algo.critic_lr=1e-3", "trainer.param_dtype=bfloat16",
                              "algo.kl_coef=0.1", "algo.kl_target=1e-4", ODD],
    "full bf16 masters": ["trainer.param_dtype=bfloat16", ODD],
    "lora": ["model.lora_r=4", ODD],
    "ppo offloaded critic and reference": ["algo.name=ppo", "algo.kl_coef=0.05", "offload.critic=true",
                                           "offload.reference=true", ODD],
    "reinforce baseline and curriculum": ["algo.name=reinforce", "rollout.curriculum_window=1", ODD],
    "environment (tools)": ["task.name=tools", "task.tools=calculator", "task.max_turns=2",
                            "task.max_episode_tokens=40"],
}
FAST = "lora ppo bf16 masters"


@pytest.mark.parametrize("kind", [pytest.param(k, marks=[] if k == FAST else pytest.mark.slow) for k in KINDS])
def test_each_kind_of_run_reads_its_own_checkpoint_back(tmp_path, monkeypatch, kind):
    monkeypatch.setattr(rl, "write_report", lambda run_dir: run_dir / "report.html")  # not what this checks
    cfg = tiny_cfg(*KINDS[kind], "run.steps=1", "task.n_heldout=2", "task.verifier_workers=1")
    train(cfg, tmp_path)
    ckpt = tmp_path / "checkpoints" / "step_000001"
    assert checkpoint.verify(ckpt) is None  # the manifest, then every file's schema
    rl.check_checkpoint(ckpt, cfg)  # of this kind of run: its algorithm, critic, adapters, masters
    summary = train(tiny_cfg(*KINDS[kind], "run.steps=2", "task.n_heldout=2", "task.verifier_workers=1"), tmp_path,
                    resume=True)
    assert summary["steps"] == 2 and checkpoint.verify(tmp_path / "checkpoints" / "step_000002") is None
