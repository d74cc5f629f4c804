"""The real entry point, end to end on the tiny model: train 2 steps, files, eval."""

import json
import math

import pytest
import torch
from helpers import TINY, TINY_EVAL, cli, run_cli
from safetensors.torch import load_file

from rlpost.model.load import load_policy


@pytest.mark.slow  # several seconds of process start-up; make test runs it, make test-fast skips it
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
        text = recipe.read_text()
        if "stages:" in text:  # a pipeline recipe: tests/recipes/test_pipeline.py
            continue
        # TINY's rollout batch is 16 sequences: a recipe's mini-batch of the demo's 128 is scaled with it
        scaled = ["trainer.mini_batch_size=8"] if "mini_batch_size" in text else []
        # the recipe's teacher is a real run
        scaled += ["algo.teacher=tiny"] if "teacher:" in text else []
        # ten terms one per line are ~280 of the tiny model's (character) tokens, past its 256-token context
        scaled += ["task.n_terms=4"] if "{steps}" in text else []
        # a mix scores each row by its own family's verifier, an environment by its step
        # (task.verifier is refused there)
        verifier = ([] if "mix:" in text or "name: tools" in text or "name: env" in text
                    else ["task.verifier=toy_verifiers:odd_length"])
        code = cli.main(["train", str(recipe), *TINY, *scaled, f"run.out_dir={tmp_path}", f"run.name={recipe.stem}",
                         *verifier])
        assert code == 0, recipe.name
        assert len((tmp_path / recipe.stem / "metrics.jsonl").read_text().splitlines()) == 2, recipe.name


def test_version_and_python_dash_m():
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("rlpost ") and r.stdout.split()[1][0].isdigit()
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    m = subprocess.run([sys.executable, "-m", "rlpost", "--version"], capture_output=True, text=True, env=env)
    assert m.returncode == 0 and m.stdout == r.stdout


def test_eval_overrides_after_options_and_samples_never_overwritten(tmp_path, monkeypatch, capsys):
    from rlpost import cli

    monkeypatch.chdir(tmp_path)
    tiny = TINY_EVAL
    # overrides after --n / --samples are overrides, as before them
    assert cli.main(["eval", "tiny", "--n", "2", *tiny, "--samples", "2", "run.seed=1"]) == 0
    assert cli.main(["eval", "tiny", "--n", "2", "--samples", "2", *tiny]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["samples_file"] == "eval_samples.2.jsonl"
    assert (tmp_path / "eval_samples.jsonl").exists() and (tmp_path / "eval_samples.2.jsonl").exists()
    assert cli.main(["eval", "tiny", "--n", "2", *tiny, "--out", "eval_samples.jsonl"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert cli.main(["eval", "tiny", "--n", "2", *tiny, "--out", "eval_samples.jsonl", "--overwrite"]) == 0


def test_options_a_command_would_ignore_are_refused(tmp_path, capsys):
    from rlpost import cli

    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "1", "answer": "1"}\n')
    cases = [
        (["train", "pref.loss=ipo"], "pref.loss: rlpost train would ignore it"),
        (["train", f"task.data={data}"], "task.data: task.name=arithmetic generates its own problems"),
        (["eval", "tiny", "trainer.lr=1e-3"], "trainer.lr: rlpost eval would ignore it"),
        (["eval", "tiny", "--k", "2"], "--k: pass@k and maj@k need --samples"),
        (["sft", "dist.topology=async"], "dist.topology: rlpost sft would ignore it"),
        (["rm", "pref.loss=ipo"], "pref.loss: rlpost rm would ignore it"),
        (["rm", "algo.icepop_c=2"], "algo.icepop_c: rlpost rm would ignore it"),  # algo.critic_lr it reads
        (["dpo", "algo.name=nonsense_algo"], "algo.name: rlpost dpo would ignore it"),
        (["dpo", "algo.tis_cap=2"], "algo.tis_cap: rlpost dpo would ignore it"),
        # pref.batch_size rows make an offline step, one pass over them: RL's step sizes were taken and dropped
        (["sft", "trainer.epochs=2"], "trainer.epochs: rlpost sft would ignore it (supervised fine-tuning runs in"),
        (["rsft", "trainer.mini_batch_size=8"], "pref.batch_size rows make one optimizer step"),
        # the rows' source it does not read: the task beside pref.data, pref.data's split without it
        (["sft", f"pref.data={data}", "task.n_train=8"], "task.n_train: rlpost sft trains on pref.data's rows"),
        (["dpo", "pref.heldout_frac=0.2"], "pref.heldout_frac: applies to pref.data's rows, and pref.data is empty"),
        (["dpo", "pref.online_rounds=2", f"pref.data={data}"], "pref.data: online DPO (pref.online_rounds=2) samples"),
        (["dpo", f"pref.data={data}", "pref.online_prompts=4"], "pref.online_prompts: rlpost dpo would ignore it"),
        # TRL's DPOConfig names: the preference key, not RL's
        (["dpo", "beta=0.1"], "beta: expected section.field, e.g. pref.beta; did you mean pref.beta=0.1? (TRL's beta"),
        (["sft", "num_train_epochs=2"], "did you mean pref.epochs=2?"),
        (["dpo", "loss_type=ipo"], "did you mean pref.loss=ipo?"),
        # a loss knob the chosen loss does not read
        (["dpo", "pref.loss=ipo", "pref.label_smoothing=0.1"], "pref.label_smoothing: pref.loss=ipo does not read it"),
        (["dpo", "pref.loss=orpo", "pref.beta=0.5"], "ORPO's weight, TRL's ORPOConfig beta, is pref.orpo_lambda"),
        (["dpo", "pref.simpo_gamma=1"], "pref.simpo_gamma: pref.loss=dpo does not read it"),
        (["train", "dist.max_staleness=3"], "dist.max_staleness: samples lag the policy only where"),
    ]
    for argv, message in cases:
        assert cli.main([*argv, f"run.out_dir={tmp_path}"]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert not any(tmp_path.glob("*/config.yaml"))  # refused before any run folder was made
    from rlpost.config_check import refuse_ignored

    refuse_ignored("rm", ["algo.critic_lr", "pref.epochs"])  # the reward head's lr: rm reads it (the pipelines set it)


def test_plan_answers_a_gpu_question_without_the_cpu_demos_defaults():
    from rlpost.cli import plan_arguments

    # --gpus 8 alone used to fail ("exactly 1 on cpu"): it plans for an H100, with a workload of real answers
    assert plan_arguments(["--params", "7B", "--gpus", "8"]) == ["--params", "7B", "--gpus", "8", "--gpu", "h100",
                                                                 "--prompt-len", "128", "--new-tokens", "256"]
    assert plan_arguments(["--gpu", "a100"]) == ["--gpu", "a100", "--prompt-len", "128", "--new-tokens", "256"]
    assert plan_arguments(["--gpu=a100", "--new-tokens", "64", "--prompt-len", "40"]) == [
        "--gpu=a100", "--new-tokens", "64", "--prompt-len", "40"]  # as given
    assert plan_arguments(["--model", "embedded"]) == ["--model", "embedded"]  # this CPU: the demo's workload
    r = cli("plan", "--params", "7B", "--gpus", "8", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["gpus"] == 8 and "H100" in out["device"] and out["workload"]["new_tokens"] == 256
    assert "planning for h100" in r.stderr


def test_plan_keeps_the_gpu_default_of_the_length_not_given():
    # --new-tokens alone used to drop the GPU's prompt of 128 too, planning the CPU demo's 47-token prompt
    r = cli("plan", "--new-tokens", "512", "--gpu", "h100", "--json")
    assert r.returncode == 0, r.stderr
    workload = json.loads(r.stdout)["workload"]
    assert (workload["prompt_len"], workload["new_tokens"]) == (128, 512)
    assert "prompt 128 by default (--prompt-len to change), --new-tokens as given" in r.stderr
    r = cli("plan", "--prompt-len=300", "--gpu", "h100", "--json")
    workload = json.loads(r.stdout)["workload"]
    assert (workload["prompt_len"], workload["new_tokens"]) == (300, 256)


def test_eval_prints_a_table_on_a_terminal_and_json_when_asked():
    from rlpost.cli import build_parser, eval_table

    table = eval_table({"target": "runs/r", "heldout_accuracy": 0.34567, "n": 200, "pass@4": 0.5})
    assert table.splitlines() == ["target            runs/r", "heldout_accuracy  0.346", "n                 200",
                                  "pass@4            0.500"]
    # JSON on a terminal too (and always through a pipe)
    assert build_parser().parse_args(["eval", "tiny", "--json"]).json


def test_eval_and_report_numbers_are_one_line(tmp_path, capsys):
    from rlpost import cli

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    cases = [(["eval", "tiny", "--samples", "2", "--k", "0"], "--k: every k must be >= 1"),
             (["eval", "tiny", "--samples", "2", "--k", "a"], "--k: expected comma-separated whole numbers"),
             (["eval", "tiny", "--n", "-1"], "--n: expected a whole number >= 0"),
             (["report", str(tmp_path), "--steps", "x"], "--steps: expected comma-separated step numbers"),
             (["report", str(tmp_path), "--steps", "0"], "--steps: expected comma-separated step numbers >= 1")]
    for argv, said in cases:
        capsys.readouterr()
        code = cli.main(argv)
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err and err.strip().startswith(f"rlpost: error: {said}"), (argv, err)


def test_ctrl_c_names_the_report_of_the_steps_so_far(tmp_path, monkeypatch):
    # a Ctrl-C during step 1: the step finishes and is saved, and the last line says how to read what it logged
    import os
    import signal

    from rlpost.roles.trainer import Trainer

    update = Trainer.update

    def interrupted(self, *a, **kw):
        os.kill(os.getpid(), signal.SIGINT)
        return update(self, *a, **kw)

    monkeypatch.setattr(Trainer, "update", interrupted)
    r = cli("train", *TINY, "run.steps=3", f"run.out_dir={tmp_path}", "run.name=r")
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 130 and "after step 1" in last, r.stderr
    run = tmp_path / "r"  # named: the line is a command to copy
    assert last.endswith(f"`rlpost train --resume {run}` continues from the last checkpoint); `rlpost report "
                         f"{run}` writes the report of the steps so far")
    assert cli("report", str(tmp_path / "r")).returncode == 0


@pytest.mark.parametrize("argv, said", [
    (["frobnicate"], "rlpost: error: argument command: invalid choice: 'frobnicate'"),
    (["train", "--bogus"], "rlpost: error: unrecognized arguments: --bogus"),
    (["curate", "x.jsonl", "--k", "abc"], "rlpost curate: error: argument --k: invalid int value: 'abc'"),
    (["plan", "--slots", "abc"], "rlpost plan: error: argument --slots: invalid int value: 'abc'"),
    (["eval", "s.yaml", "--n", "x"], "rlpost eval: error: argument --n: invalid int value: 'x'"),
])
def test_a_mistyped_option_is_one_line_not_the_usage_block(argv, said):
    from helpers import cli

    r = cli(*argv)
    assert r.returncode == 2 and r.stderr.startswith(said) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--help` lists the options" in r.stderr
