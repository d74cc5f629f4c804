"""What a run holds in memory where it could hold twice as much: the training roles are gone before
the run writes RUN/model, the export reads the checkpoint's weights and not its trainer state, and a
resumed run does not carry the checkpoint it started from. In vs_trl.py's configuration, keeping
the roles through the export made the export the run's memory peak: 5.7 GiB against 4.6 during the
steps (benchmarks/README.md)."""

import weakref

import torch
from helpers import tiny_cfg
from safetensors.torch import load_file

from rlpost import build
from rlpost.model import export
from rlpost.recipes import rl
from rlpost.recipes.rl import train


def test_the_roles_are_freed_before_the_model_is_written_which_reads_the_weights_alone(tmp_path, monkeypatch):
    trainer_models = []

    def make_roles(*a, **k):
        roles = build.build_roles(*a, **k)
        if roles.trainer is not None:  # not the held-out measurement's roles (for_eval) after the export
            trainer_models.append(weakref.ref(roles.trainer.model))
        return roles

    alive_at_export = []
    write = rl.write_selected_model

    def checked(*a, **k):
        alive_at_export.append(trainer_models[0]() is not None)
        return write(*a, **k)

    monkeypatch.setattr(rl, "write_selected_model", checked)
    cfg = tiny_cfg("run.steps=1")
    train(cfg, tmp_path / "run", make_roles=make_roles)
    assert alive_at_export == [False]

    # The export reads model.safetensors alone: trainer.pt (the optimizer's moments) is never loaded.
    def no_torch_load(*a, **k):
        raise AssertionError("the export loaded a torch pickle (trainer.pt or state.pt)")

    monkeypatch.setattr(torch, "load", no_torch_load)
    out = export.write_model(tmp_path / "run", cfg.model, cfg.run.seed, out=tmp_path / "again")
    a, b = load_file(tmp_path / "run" / "model" / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_resumed_run_does_not_keep_the_checkpoint_it_loaded(tmp_path, monkeypatch):
    run = tmp_path / "run"
    train(tiny_cfg("run.steps=1", "run.checkpoint_every=1"), run)
    loaded = []
    resume_point = rl.resume_point

    def tracked(run_dir, cfg):
        weights, trainer_state, state, ckpt = resume_point(run_dir, cfg)
        loaded.extend(weakref.ref(t) for t in weights.values())
        return weights, trainer_state, state, ckpt

    monkeypatch.setattr(rl, "resume_point", tracked)
    freed = []

    def after_step(step):  # by reference counting alone: no gc.collect (175 ms a call in a process this size)
        freed.append(sum(ref() is None for ref in loaded))

    train(tiny_cfg("run.steps=2", "run.checkpoint_every=1"), run, resume=True, on_step_end=after_step)
    assert loaded and freed == [len(loaded)]  # step 2: every loaded weight tensor copied into the roles and dropped
