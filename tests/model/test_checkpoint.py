"""Checkpoints: verified on load against their manifest, the newest intact one used (with a line
for each corrupt one passed over), never written from non-finite weights, and a full or read-only
disk reported in one line naming the path and the cause, with the older checkpoints intact."""

import pytest
import torch
from helpers import remount_read_only, tmpfs

from rlpost.model import checkpoint
from rlpost.types.errors import RunError


def write(run, step, value=1.0, keep=3):
    model = {"w": torch.full((64, 64), value), "b": torch.zeros(3)}
    trainer = {"optimizer": {"state": {0: torch.ones(64)}}, "scheduler": {"last_epoch": step}}
    return checkpoint.save(run, step, model, trainer, {"step": step}, keep)


def loaded_step(run):
    found = checkpoint.load_latest(run)
    return None if found is None else found[1][2]["step"]


# Every way a checkpoint was seen corrupted: the newest is passed over, the one before is used.
CORRUPTIONS = {
    "truncated safetensors": lambda c: (c / "model.safetensors").write_bytes((c / "model.safetensors").read_bytes()[:100]),
    "flipped byte in the weights": lambda c: flip(c / "model.safetensors"),
    "missing trainer.pt": lambda c: (c / "trainer.pt").unlink(),
    "empty trainer.pt": lambda c: (c / "trainer.pt").write_bytes(b""),
    "truncated state.pt": lambda c: (c / "state.pt").write_bytes((c / "state.pt").read_bytes()[:50]),
    "missing manifest, truncated weights": lambda c: ((c / "manifest.json").unlink(), (c / "model.safetensors").write_bytes(b"x")),
    "garbage manifest": lambda c: (c / "manifest.json").write_text("{not json"),
    "empty step folder": lambda c: [p.unlink() for p in c.iterdir()],
}


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
            checkpoint.save(run, 2, {"w": torch.ones(64, 1024)}, {}, {"step": 2}, 3)  # 256 kB: does not fit
        assert "cannot write checkpoint step 2: No space left on device" in str(e.value)
        assert str(run / "checkpoints") in str(e.value) and "\n" not in str(e.value)
        assert not list((run / "checkpoints").glob(".tmp*")) and loaded_step(run) == 1  # room freed, old one intact


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
        checkpoint.save(tmp_path, step, {"w": torch.ones(2)}, {}, {"step": step}, 1, protect=1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000001", "step_000003"]
    checkpoint.save(tmp_path, 4, {"w": torch.ones(2)}, {}, {"step": 4}, 1)  # no longer protected: it goes
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
