"""Checkpoints: verified on load against their manifest, the newest intact one used (with a line
for each corrupt one passed over), never written from non-finite weights, and a full or read-only
disk reported in one line naming the path and the cause, with the older checkpoints intact."""

import json

import pytest
import torch
from helpers import remount_read_only, tmpfs
from safetensors.torch import save_file

from rlpost.model import checkpoint
from rlpost.types.errors import ConfigError, RunError


def state(step, **extra):
    """What the loop's state.pt holds (recipes/rl.py: save_checkpoint)."""
    return {"step": step, "stream": {"epoch": 0, "pos": step}, "torch_rng": torch.get_rng_state(),
            "heldout_before": 0.5, "minutes": 0.1, "algo_name": "grpo", **extra}


def write(run, step, value=1.0, keep=3):
    model = {"w": torch.full((64, 64), value), "b": torch.zeros(3)}
    trainer = {"optimizer": {"state": {0: torch.ones(64)}, "param_groups": [{"lr": 1e-3}]},
               "scheduler": {"last_epoch": step}}
    return checkpoint.save(run, step, checkpoint.Saved(model, trainer, state(step)), keep,
                           metrics=[{"step": s} for s in range(1, step + 1)])


def loaded_step(run):
    found = checkpoint.load_latest(run)
    return None if found is None else found[1][2]["step"]


# Every way a checkpoint was seen corrupted: the newest is passed over, the one before is used.
CORRUPTIONS = {
    "truncated safetensors":
        lambda c: (c / "model.safetensors").write_bytes((c / "model.safetensors").read_bytes()[:100]),
    "flipped byte in the weights": lambda c: flip(c / "model.safetensors"),
    "missing trainer.pt": lambda c: (c / "trainer.pt").unlink(),
    "empty trainer.pt": lambda c: (c / "trainer.pt").write_bytes(b""),
    "truncated state.pt": lambda c: (c / "state.pt").write_bytes((c / "state.pt").read_bytes()[:50]),
    "missing manifest, truncated weights": lambda c: ((c / "manifest.json").unlink(),
                                                      (c / "model.safetensors").write_bytes(b"x")),
    "garbage manifest": lambda c: (c / "manifest.json").write_text("{not json"),
    "empty step folder": lambda c: [p.unlink() for p in c.iterdir()],
}


def reseal(ckpt):
    """The manifest rewritten to match the files as they are now: only the schemas can tell."""
    names = [n for n in ("model.safetensors", "trainer.pt", "state.pt", "metrics.jsonl") if (ckpt / n).exists()]
    files = {n: {"bytes": (ckpt / n).stat().st_size, "sha256": checkpoint.sha256(ckpt / n)} for n in names}
    (ckpt / "manifest.json").write_text(json.dumps({"step": checkpoint.step_of(ckpt), "files": files}))


def manifest(ckpt, **change):
    (ckpt / "manifest.json").write_text(json.dumps({**json.loads((ckpt / "manifest.json").read_text()), **change}))


# Damaged but parseable, each sealed with a matching manifest where the damage is not the manifest's:
# the schema of the file names what is wrong (issue 43: these raised from deep inside).
SCHEMA_DAMAGE = {
    "manifest files is a list": (lambda c: manifest(c, files=["model.safetensors"]),
                                 "manifest.json: files: expected a mapping"),
    "manifest entries are numbers": (lambda c: manifest(c, files={"model.safetensors": 1, "trainer.pt": 2,
                                                                  "state.pt": 3}),
                                     "manifest.json: files.model.safetensors: expected a mapping, got 1"),
    "manifest of another step": (lambda c: manifest(c, step=7),
                                 "manifest.json: step: 7, but the folder is step_000002"),
    "state.pt is {}": (lambda c: (torch.save({}, c / "state.pt"), reseal(c)), "step_000002/state.pt: step: missing"),
    "state.pt is a list": (lambda c: (torch.save([1], c / "state.pt"), reseal(c)), "state.pt: expected a mapping"),
    "state.pt without the RNG": (lambda c: (torch.save({k: v for k, v in state(2).items() if k != "torch_rng"},
                                                       c / "state.pt"),
                                            reseal(c)), "state.pt: torch_rng: missing"),
    "state.pt of another step": (lambda c: (torch.save(state(9), c / "state.pt"), reseal(c)),
                                 "state.pt: step: 9, but the folder"),
    "trainer.pt is {}": (lambda c: (torch.save({}, c / "trainer.pt"), reseal(c)), "trainer.pt: optimizer: missing"),
    "trainer.pt param_groups a dict": (lambda c: (torch.save({"optimizer": {"state": {}, "param_groups": {}},
                                                              "scheduler": {}},
                                                             c / "trainer.pt"), reseal(c)),
                                       "trainer.pt: optimizer.param_groups: expected a list"),
    "metrics copy not JSON lines": (lambda c: ((c / "metrics.jsonl").write_text('{"step": 1}\n[2]\n'), reseal(c)),
                                    "metrics.jsonl[1]: expected a mapping"),
    "weights with no tensor": (lambda c: (save_file({}, c / "model.safetensors"), reseal(c)),
                               "model.safetensors holds no tensor"),
}


@pytest.mark.parametrize("name", SCHEMA_DAMAGE)
def test_a_damaged_but_parseable_checkpoint_is_named_by_file_and_field(tmp_path, capfd, name):
    write(tmp_path, 1)
    newest = write(tmp_path, 2)
    damage, said = SCHEMA_DAMAGE[name]
    damage(newest)
    assert loaded_step(tmp_path) == 1 and checkpoint.newest_intact(tmp_path).name == "step_000001"
    err = capfd.readouterr().err
    assert f"checkpoint {newest} is corrupt: " in err and said in err and "falling back to step_000001" in err, err


def test_what_is_not_a_checkpoint_is_ignored_with_a_line_and_never_rotated_away(tmp_path, capfd):
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / "step_junk").mkdir()
    (root / "step_000009").write_text("a file, not a folder")
    (root / "notes.txt").write_text("mine")
    for step in (1, 2, 3):
        write(tmp_path, step, keep=1)
    assert [p.name for p in checkpoint.candidates(tmp_path)] == ["step_000003"] and loaded_step(tmp_path) == 3
    assert {"step_junk", "step_000009", "notes.txt"} <= {p.name for p in root.iterdir()}
    err = capfd.readouterr().err
    assert err.count("not a checkpoint") == 3 and "step_junk: not a checkpoint (a folder" in err


def test_a_checkpoint_of_another_kind_of_run_is_refused_by_name(tmp_path):
    ckpt = write(tmp_path, 1)
    checkpoint.check_fits(ckpt, "grpo", needs_values=False, lora=False, master=False)  # its own kind: fine
    with pytest.raises(ConfigError, match=r"a checkpoint of a grpo run \(state.pt: algo_name\), and this run is ppo"):
        checkpoint.check_fits(ckpt, "ppo", needs_values=True, lora=False, master=False)
    torch.save({k: v for k, v in state(1).items() if k != "algo_name"}, ckpt / "state.pt")  # an older checkpoint
    with pytest.raises(ConfigError,
                       match=r"trainer.pt: critic: absent \(a critic \(value head\)\), and this run \(ppo\) needs it"):
        checkpoint.check_fits(ckpt, "ppo", needs_values=True, lora=False, master=False)


def test_weights_of_another_model_are_one_line_naming_the_tensor():
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ConfigError, match=r"^ckpt/model.safetensors: tensor bias is missing; were these weights"):
        checkpoint.load_into(model, {"weight": torch.zeros(2, 3)}, "ckpt/model.safetensors")
    with pytest.raises(ConfigError, match=r"tensor weight is of another shape: \(3, 3\) there, \(2, 3\) in the model"):
        checkpoint.load_into(model, {"weight": torch.zeros(3, 3), "bias": torch.zeros(2)}, "w")
    checkpoint.load_into(model, {"weight": torch.ones(2, 3), "bias": torch.zeros(2)}, "w")
    assert torch.equal(model.weight, torch.ones(2, 3))


def flip(path):
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_a_corrupt_newest_checkpoint_falls_back_to_the_one_before(tmp_path, capfd, name):
    write(tmp_path, 1)
    newest = write(tmp_path, 2)
    CORRUPTIONS[name](newest)
    assert loaded_step(tmp_path) == 1
    err = capfd.readouterr().err
    assert err.count(f"checkpoint {newest} is corrupt") == 1 and "falling back to step_000001" in err


def test_a_bad_latest_pointer_is_only_a_hint(tmp_path):
    write(tmp_path, 1)
    write(tmp_path, 2)
    for text in ("", "step_999999", "garbage\n"):
        (tmp_path / "checkpoints" / "latest").write_text(text)
        assert loaded_step(tmp_path) == 2


def test_every_checkpoint_corrupt_is_none_with_a_line(tmp_path, capfd):
    (write(tmp_path, 1) / "trainer.pt").unlink()
    assert loaded_step(tmp_path) is None and checkpoint.newest_intact(tmp_path) is None
    assert "no older checkpoint to fall back to" in capfd.readouterr().err


def test_nonfinite_weights_are_never_written_and_the_last_good_one_stays(tmp_path):
    write(tmp_path, 1, keep=1)
    with pytest.raises(RunError, match=r"step 2: the weights are not finite \(w\); no checkpoint written"):
        write(tmp_path, 2, value=float("nan"), keep=1)
    assert [p.name for p in checkpoint.candidates(tmp_path)] == ["step_000001"] and loaded_step(tmp_path) == 1


def test_disk_full_names_the_path_and_the_cause_and_keeps_the_old_checkpoint(tmp_path):
    with tmpfs(tmp_path / "disk", "64k") as run:
        write(run, 1)  # about 17 kB of weights and state
        with pytest.raises(RunError) as e:
            saved = checkpoint.Saved({"w": torch.ones(64, 1024)}, {}, state(2))  # 256 kB: does not fit
            checkpoint.save(run, 2, saved, 3)
        assert "cannot write checkpoint step 2: No space left on device" in str(e.value)
        assert str(run / "checkpoints") in str(e.value) and "\n" not in str(e.value)
        assert not list((run / "checkpoints").glob(".tmp*")) and loaded_step(run) == 1  # room freed, old one intact


def test_a_disk_with_room_for_less_than_two_more_checkpoints_is_said_once(tmp_path, capfd):
    big = checkpoint.Saved({"w": torch.ones(64, 1024)}, {}, {"step": 1})  # 256 kB of weights
    with tmpfs(tmp_path / "roomy", "4m") as run:
        checkpoint.save(run, 1, big, 1)
        assert "disk:" not in capfd.readouterr().err  # 3.7 MB free: room for many more
    with tmpfs(tmp_path / "tight", "640k") as run:
        checkpoint.save(run, 1, big, 1)
        err = capfd.readouterr().err
        assert f"MB free under {run / 'checkpoints'}, and a checkpoint takes 0.3 MB" in err
        assert "run.keep_checkpoints" in err and err.count("\n") == 1
        checkpoint.save(run, 2, checkpoint.Saved(big.model_state, {}, {"step": 2}), 1)  # still short, already said
        assert "disk:" not in capfd.readouterr().err
        assert [p.name for p in checkpoint.candidates(run)] == ["step_000002"]


def test_a_read_only_folder_names_the_path_and_the_cause(tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as run:
        write(run, 1)
        remount_read_only(run)
        with pytest.raises(RunError, match=r"cannot write checkpoint step 2: Read-only file system \(.*checkpoints"):
            write(run, 2)
        assert loaded_step(run) == 1  # reading still works


def test_the_protected_step_survives_the_rotation(tmp_path):
    # keep=1 keeps only the newest, except the step early stopping selected (run.early_stop_patience)
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step, checkpoint.Saved({"w": torch.ones(2)}, {}, {"step": step}), 1, protect=1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000001", "step_000003"]
    checkpoint.save(tmp_path, 4, checkpoint.Saved({"w": torch.ones(2)}, {}, {"step": 4}), 1)  # unprotected: gone
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000004"]


def test_only_a_shared_storage_is_copied_for_safetensors():
    # The tied head is the embedding: safetensors refuses two names on one storage, so the second is
    # copied; every other weight is written from where it is (no 540 MB transient per checkpoint).
    from rlpost.model.checkpoint import unshared

    emb, w = torch.randn(5, 3), torch.randn(3, 3)
    out = unshared({"embed": emb, "head": emb, "w": w, "wt": w.t()})
    assert out["embed"].data_ptr() == emb.data_ptr() and out["w"].data_ptr() == w.data_ptr()  # first users: not copied
    assert out["head"].data_ptr() != emb.data_ptr() and torch.equal(out["head"], emb)
    assert out["wt"].is_contiguous() and torch.equal(out["wt"], w.t())


def test_a_second_signal_inside_the_rotation_leaves_no_half_deleted_checkpoint(tmp_path, monkeypatch):
    """Ctrl-C twice: the second lands while the rotation deletes the oldest checkpoint. That folder is
    renamed out of the checkpoints' names before its files go, so what is left is either a whole step_N
    or a .del_ folder (never listed, never resumed from), which the next save removes."""
    import shutil

    for step in (1, 2):
        checkpoint.save(tmp_path, step, checkpoint.Saved({"w": torch.ones(2)}, {}, {"step": step}), 2)
    real = shutil.rmtree

    def cut_short(path, *a, **k):
        if "step_000001" in str(path):
            next(p for p in sorted(__import__("pathlib").Path(path).rglob("*")) if p.is_file()).unlink()
            raise KeyboardInterrupt  # one file gone, the rest still there
        return real(path, *a, **k)

    monkeypatch.setattr(shutil, "rmtree", cut_short)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(tmp_path, 3, checkpoint.Saved({"w": torch.ones(2)}, {}, {"step": 3}), 2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000002", "step_000003"]
    assert all(checkpoint.verify(p) is None for p in root.glob("step_*"))  # every one listed is whole
    assert (root / ".del_step_000001").is_dir()
    monkeypatch.setattr(shutil, "rmtree", real)
    checkpoint.save(tmp_path, 4, checkpoint.Saved({"w": torch.ones(2)}, {}, {"step": 4}), 2)
    assert sorted(p.name for p in root.iterdir() if p.name != "latest") == ["step_000003", "step_000004"]


def test_state_that_does_not_fit_the_run_is_one_line_naming_the_checkpoint():
    # checkpoint.fitting, around the RL loop's and the offline runs' putting state back
    with pytest.raises(ConfigError, match=r"^checkpoint step_000007: its trainer.pt or state.pt does not fit this run "
                                      r"\(KeyError: 'stream'\); was it written by another kind of run\?$"):
        with checkpoint.fitting(7):
            {}["stream"]
    with pytest.raises(ConfigError, match="^stream.epoch: named by its schema$"):  # named already: passed as it is
        with checkpoint.fitting(7):
            raise ConfigError("stream.epoch: named by its schema")
