"""The real entry point, end to end on the tiny model: train 2 steps, files, eval."""

import json
import math

import pytest
import torch
from helpers import TINY, cli, run_cli
from safetensors.torch import load_file

from rlpost.model.load import load_policy


def test_train_two_steps_then_eval(tmp_path):
    r = run_cli("train", *TINY, f"run.out_dir={tmp_path}", "run.name=cli", "algo.kl_coef=0.05",
                "task.verifier=toy_verifiers:odd_length")
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "cli"
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [1, 2]
    samples = [json.loads(l) for l in (run / "samples" / "step_000002.jsonl").read_text().splitlines()]
    assert len(samples) == 16 and {"prompt", "completion", "reward"} <= set(samples[0])
    # the metrics are the values they name: reward and length of the step's own samples (odd_length
    # rewards odd-length completions); step 1 samples from the reference itself, so its KL is 0
    step2 = lines[1]
    assert step2["reward/mean"] == pytest.approx(sum(s["reward"] for s in samples) / 16)
    assert all(s["reward"] == len(s["completion"]) % 2 for s in samples)
    assert 1 <= step2["response_length/mean"] <= 6 and 0 <= step2["actor/pg_clipfrac"] <= 1
    assert lines[0]["actor/kl"] == pytest.approx(0.0, abs=1e-6) and step2["actor/kl"] > 0
    assert 0 < step2["actor/entropy"] <= math.log(76)  # at most uniform over the tiny vocabulary
    assert step2["actor/grad_norm"] > 0 and step2["perf/throughput"] > 0
    assert all(step2[f"timing_s/{k}"] > 0 for k in ("gen", "update", "ref"))
    summary = json.loads((run / "summary.json").read_text())
    assert 0 <= summary["heldout_accuracy_before"] <= 1 and 0 <= summary["heldout_accuracy_after"] <= 1
    assert (run / "config.yaml").exists()
    # parameters changed: the checkpoint differs from the tiny model's initial weights
    trained = load_file(run / "checkpoints" / "step_000002" / "model.safetensors")
    init = load_policy("tiny").model.state_dict()
    assert any(not torch.equal(trained[k], init[k]) for k in trained)
    # eval on the run folder reads its config and latest checkpoint
    e = cli("eval", str(run), "--n", "4")
    assert e.returncode == 0, e.stderr[-2000:]
    out = json.loads(e.stdout.strip().splitlines()[-1])
    assert out["n"] == 4 and 0 <= out["heldout_accuracy"] <= 1


def test_help_lists_every_option():
    r = cli("train", "--help")
    assert r.returncode == 0
    assert "rollout.group_size" in r.stdout and "completions per prompt" in r.stdout
    assert "--resume" in r.stdout


@pytest.mark.slow
def test_every_recipe_runs_two_steps_on_the_tiny_model(tmp_path, monkeypatch):
    # In this process, through cli.main (the CLI's own path, without a Python start-up per
    # recipe); the verifier's worker process finds toy_verifiers through PYTHONPATH.
    import os

    from helpers import ROOT

    from rlpost import cli

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    for recipe in sorted((ROOT / "recipes").glob("*.yaml")):
        if "stages:" in recipe.read_text():  # a pipeline recipe: tests/preference/test_pipeline.py
            continue
        # TINY's rollout batch is 16 sequences: a recipe's mini-batch of the demo's 128 is scaled with it
        scaled = ["trainer.mini_batch_size=8"] if "mini_batch_size" in recipe.read_text() else []
        code = cli.main(["train", str(recipe), *TINY, *scaled, f"run.out_dir={tmp_path}", f"run.name={recipe.stem}",
                         "task.verifier=toy_verifiers:odd_length"])
        assert code == 0, recipe.name
        assert len((tmp_path / recipe.stem / "metrics.jsonl").read_text().splitlines()) == 2, recipe.name
