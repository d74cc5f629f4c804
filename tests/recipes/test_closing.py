"""The end of a run (recipes/rl.py: finish): RUN/model is written on a second thread while the held-out
pass runs on a sampler built from the tensors it is written from. What "after" measures must not move
(RUN/model's weights on a fresh sampler: tests/recipes/test_rl.py holds the no-update case to "before"),
and a crash in the closing must leave the checkpoint to resume from and RUN/model whole or absent."""

import json
import threading

import pytest
import torch
import transformers
from helpers import TINY, tiny_cfg
from safetensors.torch import load_file

from rlpost import build, cli, config
from rlpost.envs import build_task
from rlpost.model import checkpoint, export
from rlpost.recipes import rl
from rlpost.recipes.rl import train

UPDATES = ("task.verifier=toy_verifiers:odd_length", "run.steps=2", "task.n_heldout=4", "trainer.lr=1e-2")


def recording(passes: list):
    """build_roles, recording (model.name, the weights) of each sampler it builds."""
    def make_roles(cfg, task, weights=None, **kw):
        if kw.get("for_eval"):
            passes.append((cfg.model.name, weights))
        return build.build_roles(cfg, task, weights, **kw)
    return make_roles


def sampler_state(roles) -> dict:
    return {k: v.clone() for k, v in roles.rollout.model.state_dict().items()}


def test_the_pass_runs_on_the_exported_tensors_byte_for_byte(tmp_path):
    run, passes = tmp_path / "run", []
    cfg = tiny_cfg(*UPDATES)
    summary = train(cfg, run, make_roles=recording(passes))
    assert summary["weights_changed"] is True  # the steps moved the weights: "after" is not "before"'s model
    (name, weights), = passes  # the held-out pass after training ("before" used the loop's sampler)
    assert name == "tiny" and weights is not None  # built from tensors, not from the folder read back
    saved = load_file(run / "model" / "model.safetensors")
    assert saved.keys() <= weights.keys()
    for k, v in saved.items():  # the same bytes: dtype, shape and every bit
        w = weights[k].contiguous()
        assert v.dtype == w.dtype and torch.equal(v.view(torch.uint8), w.view(torch.uint8))
    # and those are the last step's checkpoint's, which RUN/model comes from
    ckpt = checkpoint.load_weights(checkpoint.newest_intact(run))
    assert all(torch.equal(ckpt[k], v) for k, v in saved.items())
    # The sampler built from them is the sampler a fresh load of RUN/model builds, tensor for tensor.
    task = build_task(cfg.task)
    from_tensors = build.build_roles(cfg, task, weights, for_eval=True)
    from_folder = build.build_roles(config.with_overrides(cfg, [f"model.name={run / 'model'}"]), task, None,
                                    for_eval=True)
    try:
        a, b = sampler_state(from_tensors), sampler_state(from_folder)
        assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
        assert from_tensors.rollout.tok.chat_template == from_folder.rollout.tok.chat_template
    finally:
        from_tensors.close()
        from_folder.close()


def test_the_held_out_pass_starts_while_run_model_is_still_being_written(tmp_path, monkeypatch):
    # The write waits until the pass's sampler exists: a closing that wrote RUN/model first and
    # measured it after would never get there (the wait fails the run instead).
    began = threading.Event()
    real = export.save_model

    def held_write(*a, **k):
        assert began.wait(60), "the held-out pass did not begin while RUN/model was being written"
        return real(*a, **k)

    def make_roles(cfg, task, weights=None, **kw):
        roles = build.build_roles(cfg, task, weights, **kw)
        if kw.get("for_eval"):
            began.set()
        return roles

    monkeypatch.setattr(export, "save_model", held_write)
    summary = train(tiny_cfg("run.steps=1"), tmp_path / "run", make_roles=make_roles)
    assert (tmp_path / "run" / "model" / "config.json").is_file()
    assert summary["export_write_s"] >= 0 and set(summary["wall_s"]) >= {"export", "held-out after"}


def test_a_crash_mid_export_exits_1_naming_it_and_a_resume_finishes_the_run(tmp_path, monkeypatch, capsys):
    # The write fails on its thread while the pass runs: the run ends as a failed write does (one line
    # naming the folder and the cause, exit 1), with no summary, no half folder and the checkpoint whole.
    run = tmp_path / "run"
    real = transformers.PreTrainedModel.save_pretrained

    def dies_half_way(self, folder, *a, **k):
        (folder / "model.safetensors").write_bytes(b"\0" * 1000)  # a partial file, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", dies_half_way)
    assert cli.main(["train", *TINY, *UPDATES, f"run.out_dir={tmp_path}", "run.name=run"]) == 1
    err = capsys.readouterr().err
    assert f"cannot write {run / 'model'}" in err and "No space left on device" in err
    assert not (run / "model").exists() and not list(run.glob(".model.tmp-*"))  # no half folder under either name
    ckpt = checkpoint.newest_intact(run)
    assert ckpt is not None and ckpt.name == "step_000002" and checkpoint.verify(ckpt) is None
    assert not (run / "summary.json").exists()

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", real)
    summary = train(tiny_cfg(*UPDATES), run, resume=True)
    assert summary["steps"] == 2 and summary["weights_changed"] is True
    saved = load_file(run / "model" / "model.safetensors")
    weights = checkpoint.load_weights(ckpt)
    assert all(torch.equal(weights[k], v) for k, v in saved.items())
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk["heldout_accuracy_after"] == summary["heldout_accuracy_after"]
    assert on_disk["export_write_s"] >= 0 and on_disk["wall_s"]["export"] >= 0


def test_no_update_measures_the_starting_weights_from_tensors_as_before(tmp_path):
    # The tiny model earns no reward on the default task: no step changes a weight. The pass is built
    # from the exported tensors, which are the starting model's: after == before, answer for answer.
    passes = []
    summary = train(tiny_cfg("run.steps=1"), tmp_path / "run", make_roles=recording(passes))
    (name, weights), = passes
    assert weights is not None and summary["steps_trained"] == 0
    assert summary["weights_changed"] is False and summary["heldout_answers_changed"] == 0
    assert summary["heldout_accuracy_after"] == summary["heldout_accuracy_before"]


def test_early_stopping_measures_and_writes_the_selected_steps_weights(tmp_path, monkeypatch):
    # The selection (RunGuard.select) names step 1 of 2: RUN/model and the tensors the pass is built
    # from are step 1's checkpoint, not the last step's.
    monkeypatch.setattr(rl.RunGuard, "select", lambda self, final: (1, 0.5))
    passes, run = [], tmp_path / "run"
    summary = train(tiny_cfg(*UPDATES, "run.checkpoint_every=1", "run.keep_checkpoints=2"), run,
                    make_roles=recording(passes))
    assert summary["selected_step"] == 1
    (_, weights), = passes
    first, last = (checkpoint.load_weights(run / "checkpoints" / f"step_00000{s}") for s in (1, 2))
    assert any(not torch.equal(first[k], last[k]) for k in first)  # step 2 moved the weights
    saved = load_file(run / "model" / "model.safetensors")
    assert all(torch.equal(first[k], v) and torch.equal(weights[k], v) for k, v in saved.items())


def test_a_lora_run_writes_its_adapter_and_measures_the_merged_model(tmp_path):
    passes, run = [], tmp_path / "run"
    summary = train(tiny_cfg(*UPDATES, "model.lora_r=4"), run, make_roles=recording(passes))
    assert (run / "adapter" / "adapter_config.json").is_file() and summary["weights_changed"] is True
    (_, weights), = passes
    saved = load_file(run / "model" / "model.safetensors")
    assert not any("lora" in k for k in saved)  # the merged model, a plain one
    assert all(torch.equal(weights[k], v) for k, v in saved.items())


def test_a_pass_that_fails_waits_for_run_model_to_be_written_whole(tmp_path, monkeypatch):
    # The pass stops (a Ctrl-C in it) while the write is under way: the write ends first, so RUN/model
    # is whole, loadable, and the checkpoint's weights.
    started = threading.Event()
    real = export.save_model

    def slow_write(*a, **k):
        assert started.wait(60)
        return real(*a, **k)

    def make_roles(cfg, task, weights=None, **kw):
        if kw.get("for_eval"):
            started.set()
            raise KeyboardInterrupt
        return build.build_roles(cfg, task, weights, **kw)

    monkeypatch.setattr(export, "save_model", slow_write)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(tiny_cfg("run.steps=1"), run, make_roles=make_roles)
    saved = load_file(run / "model" / "model.safetensors")
    weights = checkpoint.load_weights(checkpoint.newest_intact(run))
    assert saved and all(torch.equal(weights[k], v) for k, v in saved.items())
