"""Checkpoints that a crash cannot corrupt.

A checkpoint is a folder ``checkpoints/step_NNNNNN/`` holding the policy weights
(``model.safetensors``), the optimizer and scheduler (``trainer.pt``) and everything else a run
needs to continue exactly (``state.pt``: step, torch RNG, prompt-stream position, held-out
accuracy before training). It is written into a hidden temporary folder, flushed to disk, and
renamed into place: a folder named ``step_*`` is always complete. ``latest`` names the newest one
and is itself replaced atomically. A run killed at any instant resumes from the last complete
checkpoint.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(run_dir: Path, step: int, model_state: dict, trainer_state: dict, state: dict, keep: int) -> Path:
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    # safetensors refuses tensors that share storage (tied embeddings): save contiguous copies once.
    save_file({k: v.detach().contiguous().clone() for k, v in model_state.items()}, tmp / "model.safetensors")
    torch.save(trainer_state, tmp / "trainer.pt")
    torch.save(state, tmp / "state.pt")
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    write_atomic(root / "latest", final.name)
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old)
    return final


def latest(run_dir: Path) -> Path | None:
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if pointer.exists() and (root / pointer.read_text().strip()).is_dir():
        return root / pointer.read_text().strip()
    found = sorted(root.glob("step_*"))  # pointer lost between rename and pointer write
    return found[-1] if found else None


def load(ckpt: Path) -> tuple[dict, dict, dict]:
    """(model_state, trainer_state, state)."""
    model_state = load_file(ckpt / "model.safetensors")
    trainer_state = torch.load(ckpt / "trainer.pt", weights_only=False)
    state = torch.load(ckpt / "state.pt", weights_only=False)
    return model_state, trainer_state, state
