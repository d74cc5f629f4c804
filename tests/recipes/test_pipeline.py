"""`rlpost pipeline` end to end on the tiny model through the CLI: SFT -> RM -> DPO -> RLHF (PPO
against the learned reward model), each stage from the previous one's model, one table at the end."""

import json

import pytest
import yaml
from helpers import TINY, at_train_step, cli, power_cut


@pytest.mark.slow
def test_pipeline_runs_every_stage_from_the_previous_one(tmp_path):
    recipe = {
        "name": "p", "out_dir": str(tmp_path),
        "base": [o for o in TINY if not o.startswith("model.name")] + ["model.name=tiny", "pref.batch_size=8"],
        "stages": [
            {"name": "sft", "kind": "sft"},
            {"name": "rm", "kind": "rm"},
            {"name": "dpo", "kind": "dpo", "overrides": ["pref.loss=dpo"]},
            {"name": "rlhf", "kind": "rl", "reward_model": "rm", "overrides": ["algo.name=ppo", "algo.kl_coef=0.05"]},
        ],
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(recipe))
    r = cli("pipeline", str(path), "pref.max_len=32")  # command-line overrides join the base, for every stage
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads((tmp_path / "p" / "pipeline.json").read_text())
    assert [x["stage"] for x in rows] == ["start", "sft", "rm", "dpo", "rlhf"]
    assert "held-out acc" in r.stdout and "pairwise accuracy" in r.stdout
    # each stage started from the one before (the rm stage does not move the policy chain)
    dpo_cfg = yaml.safe_load((tmp_path / "p" / "dpo" / "config.yaml").read_text())
    rl_cfg = yaml.safe_load((tmp_path / "p" / "rlhf" / "config.yaml").read_text())
    assert dpo_cfg["model"]["name"].endswith("sft/model") and rl_cfg["model"]["name"].endswith("dpo/model")
    assert rl_cfg["task"]["reward_model"].endswith("rm/model")
    assert dpo_cfg["pref"]["max_len"] == rl_cfg["pref"]["max_len"] == 32
    metrics = [json.loads(l) for l in (tmp_path / "p" / "rlhf" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and "critic/kl" in metrics[0]  # PPO with the KL in the reward
    # a re-run skips finished stages
    again = cli("pipeline", str(path), "pref.max_len=32")
    assert again.returncode == 0 and again.stdout.splitlines()[-5:] == r.stdout.splitlines()[-5:]
    assert "accuracy before training" not in again.stderr  # the RL stage was not run again


def test_pipeline_recipe_errors_name_the_stage(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"stages": [{"name": "a", "kind": "rl", "reward_model": "nope"}]}))
    r = cli("pipeline", str(path))
    assert r.returncode == 2 and "stage a.reward_model" in r.stderr


def test_a_distill_stage_takes_an_earlier_stage_as_its_teacher(tmp_path):
    from rlpost.recipes.pipeline import read_pipeline, stage_config
    from rlpost.types.errors import ConfigError
    path = tmp_path / "p.yaml"
    stages = [{"name": "rs", "kind": "rsft"},
              {"name": "d", "kind": "rl", "teacher": "rs", "overrides": ["algo.name=distill"]}]
    path.write_text(yaml.safe_dump({"base": ["model.name=tiny"], "stages": stages}))
    tree = read_pipeline(path)
    cfg = stage_config(tree, tree["stages"][1], "tiny", {"rs": "/x/rs/model"}, tmp_path)
    assert cfg.algo.name == "distill" and cfg.algo.teacher == "/x/rs/model"
    for bad in ("nope", "d"):  # not a stage; not an earlier one
        stages[1]["teacher"] = bad
        path.write_text(yaml.safe_dump({"stages": stages}))
        with pytest.raises(ConfigError, match="stage d.teacher: expected the name of an earlier policy stage"):
            read_pipeline(path)


def test_a_finished_stages_summary_is_read_back_through_its_schema(tmp_path):
    from rlpost.config import ConfigError
    from rlpost.recipes.pipeline import read_summary

    path = tmp_path / "summary.json"
    for text, said in (('{"heldout_before": {"sft/nll": 1.0}}', "summary.json: heldout_after: missing"),
                       ('{"heldout_before": {"sft/nll": "x"}, "heldout_after": {}}',
                        "heldout_before.sft/nll: expected a number"),
                       ("[1]", "summary.json: expected a mapping"), ("{not json", "not readable JSON")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=said):
            read_summary(path, "sft")
    path.write_text('{"reward_mean_first": null, "reward_mean_last": null, "model": "m"}')
    assert read_summary(path, "rl")["model"] == "m"  # a run that trained no step: its table row says so


def test_every_stage_is_checked_before_the_pipeline_folder_exists(tmp_path):
    recipe = tmp_path / "p.yaml"
    recipe.write_text(yaml.safe_dump({"name": "p", "out_dir": str(tmp_path), "base": TINY, "stages": [
        {"name": "s", "kind": "sft"}, {"name": "r", "kind": "rl", "overrides": ["run.threads=100000"]}]}))
    r = cli("pipeline", str(recipe))
    assert r.returncode == 2 and r.stderr.strip().startswith("rlpost: error: stage r: run.threads: expected at most")
    assert not (tmp_path / "p").exists()


def test_the_command_line_wins_over_a_stage_and_the_base(tmp_path):
    from rlpost.recipes.pipeline import read_pipeline, stage_config
    path = tmp_path / "p.yaml"
    stages = [{"name": "s", "kind": "sft", "overrides": ["pref.epochs=2"]}]
    path.write_text(yaml.safe_dump({"base": ["model.name=tiny", "pref.epochs=1", "pref.max_len=48"], "stages": stages}))
    tree = read_pipeline(path)
    assert stage_config(tree, tree["stages"][0], "tiny", {}, tmp_path).pref.epochs == 2  # the stage over the base
    tree["command_line"] = ["pref.epochs=3"]  # rlpost pipeline p.yaml pref.epochs=3
    cfg = stage_config(tree, tree["stages"][0], "tiny", {}, tmp_path)
    assert (cfg.pref.epochs, cfg.pref.max_len) == (3, 48)


def finished_stage(cfg, sdir, kind):
    """What a finished stage leaves, in place of pipeline.run_stage: its config and summary."""
    from rlpost import config

    sdir.mkdir(parents=True, exist_ok=True)
    config.save(cfg, sdir / "config.yaml")
    summary = {"model": str(sdir), "heldout_before": {"sft/nll": 1.0}, "heldout_after": {"sft/nll": 0.5}}
    (sdir / "summary.json").write_text(json.dumps(summary))
    return summary


def test_a_finished_stage_is_not_reused_under_other_settings(tmp_path, monkeypatch):
    """A re-run that changes an override would have reused the finished stage as if trained with it."""
    from rlpost.recipes import pipeline
    from rlpost.types.errors import ConfigError

    monkeypatch.setattr(pipeline, "model_accuracy", lambda cfg, model: 0.0)
    monkeypatch.setattr(pipeline, "run_stage", finished_stage)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "out_dir": str(tmp_path), "base": ["model.name=tiny"],
                                    "stages": [{"name": "s", "kind": "sft", "overrides": ["pref.epochs=2"]}]}))
    pipeline.run_pipeline(path)
    monkeypatch.setattr(pipeline, "run_stage", lambda *a: pytest.fail("a finished stage ran again"))
    pipeline.run_pipeline(path)  # the same settings: reused
    with pytest.raises(ConfigError, match=r"^stage s: finished under other settings \(pref.epochs: 2 -> 5\); remove "):
        pipeline.run_pipeline(path, ["pref.epochs=5"])


def test_a_failing_stage_keeps_the_finished_ones_and_out_dir_is_honoured(tmp_path, monkeypatch):
    # the rm stage's data is bad: the sft stage before it finished, and must still be there to continue from
    from rlpost.recipes import pipeline
    from rlpost.types.errors import DataError

    def fake_stage(cfg, sdir, kind):
        if kind == "rm":
            raise DataError("missing.jsonl:6: expected 'rejected'")
        return finished_stage(cfg, sdir, kind)

    monkeypatch.setattr(pipeline, "model_accuracy", lambda cfg, model: 0.0)
    monkeypatch.setattr(pipeline, "run_stage", fake_stage)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "base": ["model.name=tiny", f"run.out_dir={tmp_path / 'mine'}"],
                                    "stages": [{"name": "s", "kind": "sft"}, {"name": "r", "kind": "rm"}]}))
    with pytest.raises(DataError):
        pipeline.run_pipeline(path)
    assert (tmp_path / "mine" / "p" / "s" / "summary.json").exists()  # run.out_dir in the base, and kept
    assert not (tmp_path / "runs").exists()


def test_a_stage_override_its_command_would_ignore_is_refused_before_any_stage(tmp_path):
    recipe = tmp_path / "p.yaml"
    recipe.write_text(yaml.safe_dump({"name": "p", "out_dir": str(tmp_path), "base": TINY, "stages": [
        {"name": "s", "kind": "sft"}, {"name": "g", "kind": "rl", "overrides": ["pref.beta=0.5"]}]}))
    r = cli("pipeline", str(recipe))
    assert r.returncode == 2 and "stage g: pref.beta: rlpost train would ignore it" in r.stderr, r.stderr
    assert not (tmp_path / "p").exists()


def test_train_resume_refuses_a_folder_sft_made(tmp_path):
    # `--resume ... --start-over` would have written a GRPO run over the SFT model: refused, whatever the flags
    from rlpost.observe import runfolder
    from rlpost.types import folders

    run = tmp_path / "s"
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    folders.mark(run, "run", command="sft")
    for flags in ([], ["--start-over"]):
        r = cli("train", "--resume", str(run), *flags)
        assert r.returncode == 2 and "an rlpost sft run, and rlpost train --resume continues RL runs only" in r.stderr
        assert f"rlpost sft --resume {run} continues it" in r.stderr
    finished = tmp_path / "d"  # an older rlpost's finished dpo run: no command in its marker, its summary says
    finished.mkdir()
    (finished / "config.yaml").write_text("{}\n")
    (finished / "summary.json").write_text(json.dumps({"kind": "dpo", "loss": "dpo"}))
    assert runfolder.made_by(finished) == "dpo" and runfolder.made_by(tmp_path) is None


def test_an_sft_stage_cut_short_resumes_from_its_checkpoint_under_the_same_settings(tmp_path, monkeypatch, capsys):
    from rlpost.recipes import pipeline
    from rlpost.roles.trainer import Trainer
    from rlpost.types.errors import ConfigError

    monkeypatch.setattr(pipeline, "model_accuracy", lambda cfg, model: 0.0)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "out_dir": str(tmp_path), "base": [
        "model.name=tiny", "trainer.precision=fp32", "run.threads=1", "run.progress=false", "task.n_train=64",
        "task.n_heldout=8", "pref.batch_size=16", "pref.max_len=64", "run.checkpoint_every=2"],
        "stages": [{"name": "s", "kind": "sft"}]}))
    with monkeypatch.context() as m:
        m.setattr(Trainer, "train_step", at_train_step(3, power_cut))
        with pytest.raises(RuntimeError, match="power cut"):
            pipeline.run_pipeline(path)
    stage = tmp_path / "p" / "s"
    assert [p.name for p in (stage / "checkpoints").glob("step_*")] == ["step_000002"]
    with pytest.raises(ConfigError, match=r"^stage s: cut short under other settings: pref.batch_size: cannot change"):
        pipeline.run_pipeline(path, ["pref.batch_size=8"])
    capsys.readouterr()
    pipeline.run_pipeline(path)
    assert "stage s: cut short before, resuming from step_000002" in capsys.readouterr().err
    lines = [json.loads(x) for x in (stage / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4] and (stage / "model" / "model.safetensors").exists()


def test_an_rsft_stage_cut_short_goes_on_from_its_last_round(tmp_path, monkeypatch, capsys):
    """A stage in rounds (rsft here; online DPO is the same code) keeps RUN/rounds.json: a crash during round 2's
    training and the pipeline again go on with round 2's rows, not from round 1."""
    from rlpost.recipes import pipeline, rsft

    monkeypatch.setattr(pipeline, "model_accuracy", lambda cfg, model: 0.0)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "out_dir": str(tmp_path), "base": [
        *[o for o in TINY if not o.startswith(("run.steps", "run.passk_eval"))], "pref.online_rounds=2",
        "pref.online_prompts=8", "pref.batch_size=2", "task.verifier=toy_verifiers:odd_length"],
        "stages": [{"name": "r", "kind": "rsft"}]}))
    real, calls = rsft.accepted_rows, []
    monkeypatch.setattr(rsft, "accepted_rows", lambda *a: calls.append(1) or real(*a))
    with monkeypatch.context() as m:
        m.setattr("rlpost.recipes.online.train_offline", lambda *a, **kw: power_cut())  # round 1's training
        with pytest.raises(RuntimeError, match="power cut"):
            pipeline.run_pipeline(path)
    assert len(calls) == 1  # round 1 sampled, then its training was cut
    capsys.readouterr()
    pipeline.run_pipeline(path)
    assert "stage r: cut short before, resuming from round 1 (the base model measured) (round 1's samples kept)" \
        in capsys.readouterr().err
    assert len(calls) == 2  # round 2's sampling only: round 1's rows were on disk
    summary = json.loads((tmp_path / "p" / "r" / "summary.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [0, 1, 2]
