"""Checkpoints that a crash cannot corrupt, verified when they are read.

A checkpoint is a folder ``checkpoints/step_NNNNNN/`` holding the policy weights
(``model.safetensors``), the optimizer and scheduler (``trainer.pt``), everything else a run needs
to continue exactly (``state.pt``: step, torch RNG, prompt-stream position, held-out accuracy
before training), and, written last, ``manifest.json``: the size and SHA-256 of each file. It is
written into a hidden temporary folder, flushed to disk, and renamed into place, so a folder named
``step_*`` is complete when written; ``latest`` names the newest one and is replaced atomically.

Reading (``load_latest``) trusts nothing: the newest checkpoint whose files match its manifest and
load is used; a corrupt one (a truncated file, a missing one, an empty folder, a bad ``latest``)
is reported in one line and the next older one is tried. Checkpoints without a manifest (older
rlpost) are accepted if they load.

Never written: non-finite weights (the run stops instead, and the last good checkpoint stays, since
rotation only runs after a successful write). A write that fails (disk full, read-only folder)
removes its temporary folder and ends the run with one line naming the path and the cause.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rlpost.console import say
from rlpost.model import device
from rlpost.types.errors import RunError, write_cause

MANIFEST = "manifest.json"
FILES = ("model.safetensors", "trainer.pt", "state.pt")


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


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def nonfinite(state: dict) -> list[str]:
    """Names of floating-point tensors holding a NaN or an infinity."""
    return [k for k, v in state.items() if torch.is_tensor(v) and v.is_floating_point() and not torch.isfinite(v).all()]


def save(run_dir: Path, step: int, model_state: dict, trainer_state: dict, state: dict, keep: int,
         protect: int | None = None) -> Path:
    """Write checkpoints/step_N atomically, then delete all but the ``keep`` newest, except step
    ``protect`` (early stopping's best, which the run's model may come from)."""
    bad = nonfinite(model_state)
    if bad:
        raise RunError(f"step {step}: the weights are not finite ({bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''});"
                       f" no checkpoint written, the last good one stays in {Path(run_dir) / 'checkpoints'}")
    root = run_dir / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _write(tmp, step, model_state, trainer_state, state)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        write_atomic(root / "latest", final.name)
        for old in sorted(root.glob("step_*"))[:-keep]:
            if protect is None or old.name != f"step_{protect:06d}":
                shutil.rmtree(old)
    except Exception as e:  # noqa: BLE001 - disk full, read-only, quota: one line, the old checkpoints intact
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunError(f"cannot write checkpoint step {step}: {write_cause(tmp, e)}") from None
    return final


def unshared(tensors: dict) -> dict:
    """The tensors as safetensors will write them: contiguous, and no two sharing storage (it refuses
    tied embeddings), by copying only the second and later users of a storage. Copying every
    weight, as this did before, was a 540 MB transient for the 135M model at each checkpoint, the
    run's memory peak when the last step's checkpoint was written (benchmarks/README.md)."""
    seen, out = set(), {}
    for k, v in tensors.items():
        v = v.detach().contiguous()
        key = (v.untyped_storage().data_ptr(), v.device)
        out[k] = v.clone() if key in seen else v
        seen.add(key)
    return out


def _write(folder: Path, step: int, model_state: dict, trainer_state: dict, state: dict) -> None:
    save_file(unshared(model_state), folder / "model.safetensors")
    with open(folder / "trainer.pt", "wb") as f:  # a file object: a full disk is an OSError, not 'unexpected pos'
        torch.save(trainer_state, f)
    with open(folder / "state.pt", "wb") as f:
        torch.save(state, f)
    for name in FILES:
        with open(folder / name, "rb") as fh:
            os.fsync(fh.fileno())
    files = {name: {"bytes": (folder / name).stat().st_size, "sha256": sha256(folder / name)} for name in FILES}
    write_atomic(folder / MANIFEST, json.dumps({"step": step, "files": files}, indent=1) + "\n")


_intact: set[tuple] = set()  # checkpoints verified in this process (the CLI checks before train() loads)


def verify(ckpt: Path) -> str | None:
    """None if the checkpoint's files match its manifest; else what is wrong, in a few words."""
    manifest = ckpt / MANIFEST
    stamp = tuple((ckpt / n).stat().st_mtime_ns if (ckpt / n).exists() else 0 for n in (MANIFEST, *FILES))
    if (ckpt, stamp) in _intact:
        return None
    problem = _check(ckpt, manifest)
    if problem is None:
        _intact.add((ckpt, stamp))
    return problem


def _check(ckpt: Path, manifest: Path) -> str | None:
    missing = [n for n in FILES if not (ckpt / n).is_file()]
    if not manifest.exists():  # older rlpost, or a folder emptied since: loading it decides
        return f"{missing[0]} is missing" if missing else None
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError, OSError) as e:
        return f"its manifest is unreadable ({type(e).__name__})"
    for name, want in files.items():
        path = ckpt / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != want["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {want['bytes']}"
        if sha256(path) != want["sha256"]:
            return f"{name} does not match its checksum"
    return None


def candidates(run_dir: Path) -> list[Path]:
    """Checkpoint folders, newest first (the ``latest`` pointer is a hint; the folders decide)."""
    return sorted((p for p in (Path(run_dir) / "checkpoints").glob("step_*") if p.is_dir()), reverse=True)


def load(ckpt: Path) -> tuple[dict, dict, dict]:
    """(model_state, trainer_state, state) of one checkpoint, unverified."""
    model_state = load_weights(ckpt)
    trainer_state = load_trainer_state(ckpt)
    state = torch.load(ckpt / "state.pt", map_location=device.CPU, weights_only=False)
    return model_state, trainer_state, state


def load_weights(ckpt: Path) -> dict:
    """The policy's weights alone (what an export writes), unverified: not the trainer state,
    whose optimizer moments are twice the weights' size."""
    return load_file(ckpt / "model.safetensors")


def load_trainer_state(ckpt: Path) -> dict:
    """The trainer's state (optimizer, LoRA adapters, critic), unverified."""
    return torch.load(ckpt / "trainer.pt", map_location=device.CPU, weights_only=False)


def newest_intact(run_dir: Path) -> Path | None:
    """The newest checkpoint that passes ``verify`` (each corrupt one passed over said in one line)."""
    found = candidates(run_dir)
    for i, ckpt in enumerate(found):
        problem = verify(ckpt)
        if problem is None:
            return ckpt
        _report(found, i, problem)
    return None


_reported: set[Path] = set()


def _report(found: list[Path], i: int, problem: str) -> None:
    """One line per corrupt checkpoint, once per process."""
    if found[i] not in _reported:
        _reported.add(found[i])
        older = f"falling back to {found[i + 1].name}" if i + 1 < len(found) else "no older checkpoint to fall back to"
        say(f"checkpoint {found[i]} is corrupt: {problem}; {older}")


def load_latest(run_dir: Path) -> tuple[Path, tuple[dict, dict, dict]] | None:
    """(folder, its contents) of the newest intact checkpoint, or None when there is none; each
    corrupt one passed over is said in one line."""
    found = candidates(run_dir)
    for i, ckpt in enumerate(found):
        problem = verify(ckpt)
        if problem is None:
            try:
                return ckpt, load(ckpt)
            except Exception as e:  # noqa: BLE001 - a file that passed (or had no) checksums but does not load
                problem = f"it does not load ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        _report(found, i, problem)
    return None
