"""Every recipe runs in the RL loop's scaffold: a Ctrl-C finishes the step and saves what that
recipe saves, and run.loggers reaches every sink, one line per step as it happens."""

import json
import os
import signal

import pytest
from helpers import TINY_ROWS, at_train_step, cli, tiny_cfg

from rlpost.recipes import offline, online, rl
from rlpost.recipes.online import run_online_dpo
from rlpost.recipes.rsft import run_rsft
from rlpost.roles.trainer import Trainer
from rlpost.types.errors import Interrupted

# sft, rm, dpo on 32 rows built from the arithmetic task: 4 steps of 8 rows
OFFLINE = ["pref.batch_size=8", "task.n_train=32", "pref.epochs=1", "pref.max_len=64"]
ROUNDS = ["pref.online_rounds=1", "pref.online_prompts=8", "task.verifier=toy_verifiers:odd_length",
          "pref.batch_size=4"]


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture
def sigint_at_step_2(monkeypatch):
    """SIGINT to this process during the offline trainer's second optimizer step (arrives mid-step)."""
    monkeypatch.setattr(Trainer, "train_step", at_train_step(2, lambda: os.kill(os.getpid(), signal.SIGINT)))


@pytest.mark.parametrize("kind", ["sft", "rm", "dpo"])
def test_ctrl_c_in_an_offline_recipe_saves_the_model_so_far(tmp_path, sigint_at_step_2, kind):
    with pytest.raises(Interrupted) as e:
        offline.train_offline(tiny_cfg(*OFFLINE), tmp_path, kind)
    assert e.value.saved == 2 and "after step 2, whose checkpoint (and RUN/model so far) is saved" in e.value.message
    assert ((tmp_path / "model" / "config.json").exists() and (tmp_path / "checkpoints" / "step_000002").is_dir()
            and [m["step"] for m in lines(tmp_path / "metrics.jsonl")] == [1, 2])
    assert not (tmp_path / "summary.json").exists()  # not finished: a pipeline resumes the stage


@pytest.mark.parametrize("recipe", [run_online_dpo, run_rsft])
def test_ctrl_c_in_a_sampled_round_saves_that_rounds_model(tmp_path, sigint_at_step_2, recipe):
    with pytest.raises(Interrupted) as e:
        recipe(tiny_cfg(*ROUNDS, "task.n_train=32", "pref.epochs=3"), tmp_path)
    assert e.value.saved == 2 and (tmp_path / "round_1" / "model" / "config.json").exists()


def test_ctrl_c_in_the_rl_loop_saves_the_step(tmp_path):
    kill = lambda step: os.kill(os.getpid(), signal.SIGINT) if step == 1 else None
    with pytest.raises(Interrupted) as e:
        rl.train(tiny_cfg("run.steps=3"), tmp_path, on_step_end=kill)  # after step 1's save: step 2 runs, is saved
    assert e.value.saved == 2 and (tmp_path / "checkpoints" / "step_000002").is_dir()


def tensorboard_scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.parametrize("kind", ["sft", "rm", "dpo"])
def test_run_loggers_reach_every_sink_from_an_offline_recipe(tmp_path, kind):
    r = cli(kind, *TINY_ROWS, *OFFLINE, f"run.out_dir={tmp_path}", "run.name=r", "run.loggers=console,tensorboard")
    assert r.returncode == 0, r.stderr
    jsonl = lines(tmp_path / "r" / "metrics.jsonl")
    assert [m["step"] for m in jsonl] == [1, 2, 3, 4]
    assert r.stderr.count("rlpost: step ") == 4 and "actor/loss=" in r.stderr  # console: a line per step
    scalars = tensorboard_scalars(tmp_path / "r" / "tensorboard")
    assert scalars["actor/loss"] == pytest.approx([m["actor/loss"] for m in jsonl])


def test_run_loggers_reach_every_sink_from_the_rounds(tmp_path):
    run_rsft(tiny_cfg(*ROUNDS, "task.n_train=32", "run.loggers=tensorboard"), tmp_path)
    trained = lines(tmp_path / "round_1" / "metrics.jsonl")
    assert (tensorboard_scalars(tmp_path / "round_1" / "tensorboard")["actor/loss"]
            == pytest.approx([m["actor/loss"] for m in trained]))
    rounds = lines(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in rounds] == [1]  # one line per round, as it ends
    # ... and that line reaches the run's own sinks too (run.loggers), not metrics.jsonl alone
    outer = tensorboard_scalars(tmp_path / "tensorboard")
    assert outer and all(v == pytest.approx([rounds[0][k]]) for k, v in outer.items()), outer


def test_ctrl_c_while_a_round_samples_stops_before_it_trains(tmp_path, monkeypatch, capsys):
    """The signal's line says the sampling finishes and its samples are saved; the run stops before the round
    trains, and a resume trains those samples without drawing again."""
    real, calls = online.onpolicy_pairs, []

    def sample_then_signal(*args):
        out = real(*args)
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # arrives while the round samples, in the run guard
        return out

    monkeypatch.setattr(online, "onpolicy_pairs", sample_then_signal)
    cfg = tiny_cfg(*ROUNDS, "task.n_train=32", "pref.online_rounds=2")
    with pytest.raises(Interrupted) as e:
        run_online_dpo(cfg, tmp_path)
    assert e.value.saved == 0 and "after round 1 sampled; its samples are saved" in e.value.message
    assert "SIGINT: finishing round 1's sampling" in capsys.readouterr().err
    assert (tmp_path / "round_1" / "pairs.jsonl").is_file() and not (tmp_path / "round_1" / "metrics.jsonl").exists()
    s = run_online_dpo(cfg, tmp_path, resume=True)
    assert [r["round"] for r in s["rounds"]] == [0, 1, 2] and len(calls) == 2  # round 2's sampling only


@pytest.mark.parametrize("where", ["training", "measure"])
def test_a_stop_in_a_round_names_the_round(tmp_path, monkeypatch, capsys, where):
    """A run in rounds counts rounds, and a round's training counts that round's steps: a SIGTERM during round 1's
    training stops after its step 1 (round_1's checkpoint); one while round 1 is measured stops after round 1."""
    term = lambda *a, **kw: os.kill(os.getpid(), signal.SIGTERM)  # noqa: E731
    if where == "training":
        monkeypatch.setattr(Trainer, "train_step", at_train_step(1, term))
    else:
        real = online.model_accuracy
        monkeypatch.setattr(online, "model_accuracy", lambda cfg, m: real(cfg, m) if m == "tiny" else term() or 0.0)
    with pytest.raises(Interrupted) as e:
        run_rsft(tiny_cfg(*ROUNDS, "pref.online_rounds=2", "pref.batch_size=2"), tmp_path)
    err = capsys.readouterr().err
    if where == "training":
        assert "SIGTERM: finishing round 1's step 1 (" in err and "then saving a checkpoint" not in err, err
        assert e.value.message == ("stopped by SIGTERM after round 1's step 1, whose checkpoint (and round_1/model so "
                                   "far) is saved")
    else:
        assert "SIGTERM: finishing round 1 (" in err and "then saving the model and stopping" in err, err
        assert e.value.message == "stopped by SIGTERM after round 1, whose model is saved"


@pytest.mark.slow  # W&B and MLflow start-up: ~10 s
def test_every_logger_from_an_offline_recipe(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    offline.train_offline(tiny_cfg(*OFFLINE, "run.loggers=console,tensorboard,wandb,mlflow"), tmp_path, "sft")
    jsonl = lines(tmp_path / "metrics.jsonl")
    assert list((tmp_path / "wandb").glob("offline-run-*/*.wandb"))
    client = mlflow.tracking.MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    run = client.search_runs([client.get_experiment_by_name("rlpost").experiment_id])[0]
    got = [m.value for m in client.get_metric_history(run.info.run_id, "actor.loss")]
    assert got == pytest.approx([m["actor/loss"] for m in jsonl])
