"""LoRA through peft: only adapters train, the sampler gets merged weights, resume is exact."""

import json
import signal

import pytest
import torch
from helpers import TINY, cli, run_cli_killed_after, tiny_cfg
from safetensors.torch import load_file

from rlpost.build import build_roles
from rlpost.envs import Task
from rlpost.model import lora
from rlpost.recipes.rl import train

TASK = Task([], [], "toy_verifiers:odd_length")  # the roles need a verifier; no rows are drawn


def test_only_adapters_train_and_merged_weights_are_the_plain_model(tiny):
    roles = build_roles(tiny_cfg("model.lora_r=4", "model.lora_alpha=8"), TASK)
    roles.close()  # its verifier workers: only the trainer is looked at
    trained = [p for g in roles.trainer.opt.param_groups for p in g["params"]]
    n_lora = sum(p.numel() for n, p in roles.trainer.model.named_parameters() if "lora_" in n)
    assert sum(p.numel() for p in trained) == n_lora > 0
    merged = roles.trainer.weights()
    assert merged.keys() == tiny.model.state_dict().keys()
    # B starts at zero: merged = base; after a nudge to B, merged = base + (alpha / r) B A
    assert all(torch.equal(merged[k], v) for k, v in tiny.model.state_dict().items())
    layer = roles.trainer.model.get_base_model().model.layers[0].self_attn.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.fill_(0.01)
    delta = 2.0 * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    got = roles.trainer.weights()["model.layers.0.self_attn.q_proj.weight"]
    assert torch.allclose(got, tiny.model.state_dict()["model.layers.0.self_attn.q_proj.weight"] + delta, atol=1e-6)


def test_lora_run_keeps_the_base_and_the_sampler_matches_the_trainer(tmp_path):
    task = Task(*[[{"messages": [{"role": "user", "content": str(d)}], "answer": str(d)} for d in range(10)]] * 2,
                "toy_verifiers:first_char_digit")
    cfg = tiny_cfg("model.lora_r=4", "run.steps=3", "trainer.lr=1e-2")
    train(cfg, tmp_path / "run", task=task)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # float32 sampler with merged weights vs float32 trainer through the adapters: the same function
    assert all(r["actor/logp_diff_sampler_max"] < 1e-4 for r in rows), [r["actor/logp_diff_sampler_max"] for r in rows]
    final = load_file(tmp_path / "run" / "checkpoints" / "step_000003" / "model.safetensors")
    roles = build_roles(tiny_cfg(), TASK)
    roles.close()  # its verifier workers: only the trainer's starting weights are looked at
    base = roles.trainer.model.state_dict()
    changed = [k for k in base if not torch.equal(base[k], final[k])]
    assert changed and all("proj" in k for k in changed)  # only adapted linears moved; embeddings, norms did not


@pytest.mark.slow
def test_lora_sigkill_then_resume_is_exact(tmp_path):
    args = [*TINY, "model.lora_r=4", "run.steps=4", "run.checkpoint_every=2", "trainer.lr=1e-2",
            "task.verifier=toy_verifiers:odd_length"]
    full = cli("train", *args, f"run.out_dir={tmp_path}", "run.name=full")
    assert full.returncode == 0, full.stderr[-3000:]
    killed = run_cli_killed_after(3, "train", *args, f"run.out_dir={tmp_path}", "run.name=cut")
    assert killed.returncode == -signal.SIGKILL
    resumed = cli("train", "--resume", str(tmp_path / "cut"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = load_file(tmp_path / "full" / "checkpoints" / "step_000004" / "model.safetensors")
    b = load_file(tmp_path / "cut" / "checkpoints" / "step_000004" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_is_lora(tiny):
    assert not lora.is_lora(tiny.model)


def test_an_adapter_names_the_hub_id_of_its_base_not_a_cache_folder(tmp_path):
    # peft writes the folder the base was loaded from: for the embedded model, this machine's rlpost cache, which
    # no other machine has. The hub id goes there where one is known; a folder of the user's stays its path.
    from dataclasses import replace

    from rlpost.model.load import load_policy

    snapshot = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-360M" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    mine = tmp_path / "my-model"
    mine.mkdir()
    mcfg = replace(tiny_cfg("model.lora_r=4").model)
    for name, expected in [("embedded", "HuggingFaceTB/SmolLM2-135M-Instruct"),
                           (str(snapshot), "HuggingFaceTB/SmolLM2-360M"), ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B")]:
        loaded = load_policy("tiny")
        loaded.model.name_or_path = str(tmp_path / "cache" / "models" / "smollm2-135m-instruct")  # as it was loaded
        out = lora.save_adapter(lora.wrap(loaded.model, replace(mcfg, name=name), 0), loaded.tokenizer,
                                tmp_path / name.replace("/", "_")[-20:])
        assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == expected, name
    loaded = load_policy("tiny")
    loaded.model.name_or_path = str(mine)
    out = lora.save_adapter(lora.wrap(loaded.model, replace(mcfg, name=str(mine)), 0), loaded.tokenizer, tmp_path / "o")
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(mine)
