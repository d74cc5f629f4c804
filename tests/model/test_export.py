"""Every run ends with a transformers folder: plain transformers reloads it and generates what
`rlpost eval` generated; `rlpost export` writes one from any checkpoint; `model.name=RUN` trains
again from it; LoRA runs export their adapters in peft's format."""

import json

import pytest
import torch
from helpers import TINY, tiny_cfg
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlpost import cli, config
from rlpost.envs import Task, build_task
from rlpost.model import checkpoint
from rlpost.recipes.export import export_run
from rlpost.model.load import load_policy
from rlpost.recipes.rl import train


def last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow
def test_train_export_reload_in_transformers_and_train_again(tmp_path, capsys):
    run = tmp_path / "first"
    verifier = "task.verifier=toy_verifiers:odd_length"  # rewards vary whatever the tiny model says: it trains
    assert cli.main(["train", *TINY, verifier, f"run.out_dir={tmp_path}", "run.name=first"]) == 0
    folder = run / "model"
    assert ({"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}
            <= {p.name for p in folder.iterdir()})
    assert json.loads((run / "summary.json").read_text())["model"] == str(folder)

    # rlpost eval's greedy completions ...
    assert cli.main(["eval", str(run), "--n", "4"]) == 0
    samples = [json.loads(line) for line in (run / "eval_samples.jsonl").read_text().splitlines()]
    # ... are what plain transformers generates from the folder, with the chat template it holds
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    rows = build_task(config.load(run / "config.yaml").task).heldout[:4]
    assert [r["messages"][-1]["content"] for r in rows] == [s["prompt"] for s in samples]
    for row, sample in zip(rows, samples):
        ids = tok.apply_chat_template(row["messages"], add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)
        out = model.generate(**ids, do_sample=False, max_new_tokens=6)
        assert tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True) == sample["completion"]

    # any kept checkpoint exports; the last one is the run's own model
    assert cli.main(["export", str(run), "--step", "2", "--out", str(tmp_path / "step2")]) == 0
    assert last_json(capsys)["out"] == str(tmp_path / "step2")
    a, b = load_file(folder / "model.safetensors"), load_file(tmp_path / "step2" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert cli.main(["export", str(run), "--step", "1"]) == 2  # run.checkpoint_every=0: only the last step is kept
    assert "--step 1" in capsys.readouterr().err
    assert cli.main(["export", str(run), "--merge-lora"]) == 2  # a full fine-tune has no adapters to merge

    # model.name=RUN is that folder, and a new run trains on from it
    loaded = load_policy(str(run)).model.state_dict()
    assert all(torch.equal(loaded[k], a[k]) for k in a)
    assert cli.main(["train", *TINY, verifier, f"model.name={run}", f"run.out_dir={tmp_path}", "run.name=again"]) == 0
    again = load_file(tmp_path / "again" / "model" / "model.safetensors")
    assert any(not torch.equal(again[k], a[k]) for k in a)


def test_lora_run_exports_merged_model_and_peft_adapters(tmp_path, capsys):
    from peft import PeftModel

    task = Task(*[[{"messages": [{"role": "user", "content": str(d)}], "answer": str(d)} for d in range(10)]] * 2,
                "toy_verifiers:first_char_digit")
    cfg = tiny_cfg("model.lora_r=4", "trainer.lr=1e-2")
    run = tmp_path / "lora"
    run.mkdir()
    config.save(cfg, run / "config.yaml")
    train(cfg, run, task=task)
    merged = load_file(run / "model" / "model.safetensors")
    ckpt = load_file(run / "checkpoints" / "step_000002" / "model.safetensors")
    assert all(torch.equal(merged[k], ckpt[k]) for k in merged)  # (the tied lm_head is not stored twice)
    # without --merge-lora: the adapters alone, which peft puts back on the base to the same weights
    adapter = export_run(run)  # beside the run, never in it
    assert adapter == tmp_path / "lora-adapter" and (adapter / "adapter_config.json").exists()
    peft_model = PeftModel.from_pretrained(load_policy("tiny").model, adapter)
    again = peft_model.merge_and_unload().state_dict()
    assert all(torch.allclose(again[k], ckpt[k], atol=1e-6) for k in ckpt)
    assert export_run(run, merge_lora=True) == tmp_path / "lora-model"
    # the run itself ended with the same adapters in RUN/adapter, without an export
    ours, exported = (load_file(run / "adapter" / "adapter_model.safetensors"),
                      load_file(adapter / "adapter_model.safetensors"))
    assert ours.keys() == exported.keys() and all(torch.equal(ours[k], exported[k]) for k in ours)
    # --dtype bfloat16: every weight in bf16, config.json says so, and transformers loads it as such
    half = export_run(run, merge_lora=True, out=tmp_path / "bf16", dtype="bfloat16")
    weights = load_file(half / "model.safetensors")
    assert {v.dtype for v in weights.values()} == {torch.bfloat16}
    assert all(torch.equal(weights[k], merged[k].to(torch.bfloat16)) for k in weights)
    assert AutoModelForCausalLM.from_pretrained(half).dtype == torch.bfloat16
    # the command's line says how each loads: the adapters onto their base (model.name= cannot take them)
    capsys.readouterr()
    assert cli.main(["export", str(run), "--out", str(tmp_path / "a2")]) == 0
    assert "peft's adapters alone: load them onto their base" in capsys.readouterr().err
    assert cli.main(["export", str(run), "--merge-lora", "--out", str(tmp_path / "m2")]) == 0
    assert f"load it with model.name={tmp_path / 'm2'}" in capsys.readouterr().err


def test_export_in_float16_refuses_a_weight_past_its_range_and_writes_nothing(tmp_path, capsys, monkeypatch):
    # the cast made such a weight inf, silently; bfloat16 (float32's range) takes it as it is
    assert cli.main(["train", *TINY, "run.steps=1", f"run.out_dir={tmp_path}", "run.name=r"]) == 0
    run, load_weights = tmp_path / "r", checkpoint.load_weights
    key = "model.layers.0.mlp.up_proj.weight"

    def one_big_weight(ckpt):
        weights = load_weights(ckpt)
        weights[key] = weights[key].clone()
        weights[key][0, 1] = -69632.0  # 2**16 * 1.0625: exact in bfloat16; float16's largest is 65504
        return weights

    monkeypatch.setattr(checkpoint, "load_weights", one_big_weight)
    capsys.readouterr()
    assert cli.main(["export", str(run), "--dtype", "float16", "--out", str(tmp_path / "half")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"rlpost: error: --dtype float16: model.safetensors: {key} has 1 weight(s) past float16's "
                           "range (|value| up to 69632; float16 holds at most 65504): they would be inf. Export in "
                           "float32 or bfloat16 (float32's range); nothing was written"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no folder, no temporary one left
    assert cli.main(["export", str(run), "--dtype", "bfloat16", "--out", str(tmp_path / "bf16")]) == 0
    assert load_file(tmp_path / "bf16" / "model.safetensors")[key][0, 1].item() == -69632.0
