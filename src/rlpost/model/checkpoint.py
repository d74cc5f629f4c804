"""Checkpoints that a crash cannot corrupt, verified when they are read.

A checkpoint is a folder ``checkpoints/step_NNNNNN/`` holding the policy weights
(``model.safetensors``), the optimizer and scheduler (``trainer.pt``), everything else a run needs
to continue exactly (``state.pt``: step, torch RNG, prompt-stream position, held-out accuracy
before training), and, written last, ``manifest.json``: the size and SHA-256 of each file. It is
written into a hidden temporary folder, flushed to disk, and renamed into place, so a folder named
``step_*`` is complete when written; ``latest`` names the newest one and is replaced atomically.

Each checkpoint also keeps a copy of ``metrics.jsonl`` up to its step, so a resume rebuilds a
metrics file that was deleted or damaged since (observe/runlog.py), and ``state.pt`` names the
algorithm that wrote it.

Reading (``load_latest``) trusts nothing: the newest checkpoint whose files match its manifest and
whose manifest, ``state.pt`` and ``trainer.pt`` fit their schemas (types/schema.py) is used; a
corrupt one (a truncated file, a missing one, an empty folder, a manifest whose ``files`` is a
list, a ``state.pt`` of ``{}``) is reported in one line naming the file and the field, and the
next older one is tried. What is in ``checkpoints/`` but is no checkpoint is ignored
(model/layout.py). A checkpoint that is intact but of another kind of run (another algorithm, a
critic where this run has none, LoRA adapters where it trains in full) is refused by name
(``check_fits``). Checkpoints without a manifest (older rlpost) are accepted if they load.

Never written: non-finite weights (the run stops instead, and the last good checkpoint stays, since
rotation only runs after a successful write). A write that fails (disk full, read-only folder)
removes its temporary folder and ends the run with one line naming the path and the cause. So does
a second stop signal during the write (even one that torch.save's writer turned into its own
RuntimeError), which then stops the run as that signal does: the checkpoint is whole or absent.
Before that happens, the first checkpoint that leaves the disk less room than two more says so in
one line (``warn_if_short``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from rlpost.console import say, say_once
from rlpost.model import device
from rlpost.model.layout import EXTRA, FILES, MANIFEST, candidates, manifest_files, step_of
from rlpost.types.errors import ConfigError, RunError, interrupt_in, write_cause, writing
from rlpost.types.schema import ListOf, Where, check

__all__ = ["EXTRA", "FILES", "MANIFEST", "candidates", "step_of"]  # re-exported: checkpoint.candidates etc.


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """``text`` as the file ``path``, whole or not at all (written beside it, then renamed); a write the
    disk refuses is one line naming ``path`` (RunError)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with writing(path):
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def nonfinite(state: dict) -> list[str]:
    """Names of floating-point tensors holding a NaN or an infinity."""
    return [k for k, v in state.items() if torch.is_tensor(v) and v.is_floating_point() and not torch.isfinite(v).all()]


class Saved(NamedTuple):
    """What one checkpoint holds: the weights, the trainer's state (optimizer, schedule, critic,
    masters) and the loop's (step, sampler, algorithm, early stopping)."""
    model_state: dict
    trainer_state: dict
    state: dict


def save(run_dir: Path, step: int, saved: Saved, keep: int, protect: int | None = None,
         metrics: list[dict] = ()) -> Path:
    """Write checkpoints/step_N atomically (with ``metrics``, the run's metric lines up to it),
    then delete all but the ``keep`` newest, except step ``protect`` (early stopping's best, which
    the run's model may come from)."""
    model_state, trainer_state, state = saved
    bad = nonfinite(model_state)
    if bad:
        raise RunError(f"step {step}: the weights are not finite "
                       f"({bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}); no checkpoint written, the "
                       f"last good one stays in {Path(run_dir) / 'checkpoints'}")
    root = run_dir / "checkpoints"
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        for doomed in root.glob(".del_step_*"):  # a rotation a signal cut short: finish deleting it
            shutil.rmtree(doomed, ignore_errors=True)
        tmp.mkdir()
        _write(tmp, step, model_state, trainer_state, state, metrics)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        _intact.add((final, _stamp(final)))  # hashed as it was written: the export at the end need not read it again
        write_atomic(root / "latest", final.name)
        for old in candidates(run_dir, quiet=True)[keep:]:  # checkpoints only: nothing else there is deleted
            if protect is None or step_of(old) != protect:
                # renamed out of the checkpoints' names first (atomic), then deleted: a second stop signal
                # inside the delete leaves a .del_ folder the next save removes, never a half-deleted step_N
                doomed = root / f".del_{old.name}"
                os.replace(old, doomed)
                shutil.rmtree(doomed)
        warn_if_short(root, final)
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - disk full, read-only, quota, a second stop signal
        shutil.rmtree(tmp, ignore_errors=True)  # the checkpoint is whole (renamed into place) or absent
        stop = interrupt_in(e)  # a signal inside torch.save surfaces as its RuntimeError: the stop is what happened
        if stop is e:
            raise
        if stop is not None:
            raise stop from None
        cause = str(e).removeprefix("cannot write ") if isinstance(e, RunError) else write_cause(tmp, e)
        raise RunError(f"cannot write checkpoint step {step}: {cause}") from None  # the old checkpoints intact
    return final


def warn_if_short(root: Path, ckpt: Path) -> None:
    """One line, once a run, when the disk under ``root`` has less room than two more checkpoints
    of ``ckpt``'s size: the next one is written whole before the oldest is deleted, and the run's
    closing export writes the weights again. Said at the checkpoint that first sees it, hours before
    a write would fail (which would still end the run cleanly, the older checkpoints intact)."""
    size = sum(f.stat().st_size for f in ckpt.iterdir() if f.is_file())
    free = shutil.disk_usage(root).free
    if free < 2 * size:
        say_once(f"disk: {free / 1e6:,.1f} MB free under {root}, and a checkpoint takes {size / 1e6:,.1f} MB: the "
                 f"next one (written before the oldest is deleted) or the final export may not fit; free some "
                 f"space, lower run.keep_checkpoints or point run.out_dir elsewhere", key=f"disk:{root}")


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


def _write(folder: Path, step: int, model_state: dict, trainer_state: dict, state: dict, metrics: list[dict]) -> None:
    """The files, then the manifest of their sizes and hashes. Each file is synced and hashed on a second
    thread while the next one is written (hashlib and the writes release the GIL): the optimizer's
    moments first, the largest, so their hash overlaps the weights' write."""
    def settle(name: str) -> dict:
        with open(folder / name, "rb") as fh:
            os.fsync(fh.fileno())
        return {"bytes": (folder / name).stat().st_size, "sha256": sha256(folder / name)}

    with ThreadPoolExecutor(max_workers=1) as pool:
        done = {}
        with open(folder / "trainer.pt", "wb") as f:  # a file object: a full disk is an OSError, not 'unexpected pos'
            torch.save(trainer_state, f)
        done["trainer.pt"] = pool.submit(settle, "trainer.pt")
        save_file(unshared(model_state), folder / "model.safetensors")
        done["model.safetensors"] = pool.submit(settle, "model.safetensors")
        with open(folder / "state.pt", "wb") as f:
            torch.save(state, f)
        with open(folder / "metrics.jsonl", "w") as f:
            f.write("".join(json.dumps(m) + "\n" for m in metrics))
        done.update((name, pool.submit(settle, name)) for name in ("state.pt", "metrics.jsonl"))
        files = {name: done[name].result() for name in FILES + EXTRA}
    write_atomic(folder / MANIFEST, json.dumps({"step": step, "files": files}, indent=1) + "\n")


_intact: set[tuple] = set()  # checkpoints verified in this process (the CLI checks before train() loads)


def verify(ckpt: Path) -> str | None:
    """None if the checkpoint's files match its manifest; else what is wrong, in a few words."""
    manifest = ckpt / MANIFEST
    stamp = _stamp(ckpt)
    if (ckpt, stamp) in _intact:
        return None
    problem = _check(ckpt, manifest) or _check_content(ckpt)
    if problem is None:
        _intact.add((ckpt, stamp))
    return problem


def _stamp(ckpt: Path) -> tuple:
    """The files' modification times: a file changed since it was verified is verified again."""
    return tuple((ckpt / n).stat().st_mtime_ns if (ckpt / n).exists() else 0 for n in (MANIFEST, *FILES, *EXTRA))


def _check_content(ckpt: Path) -> str | None:
    """What the files hold, checked against their schemas (cheap: state.pt is small, trainer.pt is
    memory-mapped, of the weights only the header is read)."""
    try:
        load_state(ckpt)
        _trainer_keys(ckpt)
        saved_metrics(ckpt)
        with safe_open(ckpt / "model.safetensors", "pt") as f:
            if not list(f.keys()):
                return "model.safetensors holds no tensor"
    except ConfigError as e:  # a field that does not fit: named
        return str(e)
    except Exception as e:  # noqa: BLE001 - a file that does not load at all
        return f"it does not load ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
    return None


def _check(ckpt: Path, manifest: Path) -> str | None:
    missing = [n for n in FILES if not (ckpt / n).is_file()]
    if not manifest.exists():  # older rlpost, or a folder emptied since: loading it decides
        return f"{missing[0]} is missing" if missing else None
    try:
        files = manifest_files(ckpt, manifest.read_text())
    except OSError as e:
        return f"its manifest is unreadable ({e.strerror})"
    except ValueError as e:  # not JSON, or a field that does not fit the schema: named
        return str(e)
    for name, want in files.items():
        path = ckpt / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != want["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {want['bytes']}"
        if sha256(path) != want["sha256"]:
            return f"{name} does not match its checksum"
    return None


def load(ckpt: Path) -> tuple[dict, dict, dict]:
    """(model_state, trainer_state, state) of one checkpoint, its state and trainer state checked
    against their schemas (DataError naming the file and the field); the files are not verified."""
    model_state = load_weights(ckpt)
    trainer_state = load_trainer_state(ckpt)
    state = load_state(ckpt)
    return model_state, trainer_state, state


def load_state(ckpt: Path) -> dict:
    """state.pt (small: the step, the stream position, the RNG), checked against its schema."""
    state = torch.load(ckpt / "state.pt", map_location=device.CPU, weights_only=False)
    check(state, STATE, f"{ckpt.name}/state.pt")
    if state["step"] != step_of(ckpt):
        raise ConfigError(f"{ckpt.name}/state.pt: step: {state['step']}, but the folder is {ckpt.name}")
    return state


def saved_metrics(ckpt: Path) -> list[dict] | None:
    """The metric lines the checkpoint keeps (up to its step), None when it keeps none (older rlpost)."""
    path = ckpt / "metrics.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return check(rows, ListOf(METRIC_LINE), f"{ckpt.name}/metrics.jsonl")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# What the loop reads back from state.pt and trainer.pt (recipes/rl.py: resume_state; roles/trainer.py)
STATE = {
    "step": Where(lambda v: _is_int(v) and v >= 1, "a step number >= 1"),
    "stream": dict,  # a PromptStream's or a MixedStream's own state_dict
    "torch_rng": Where(lambda v: torch.is_tensor(v) and v.dtype == torch.uint8, "torch's RNG state (a uint8 tensor)"),
    "heldout_before": (float, type(None)),
    "minutes": float,
    "early_stop?": {"best": Where(lambda v: v is None or (len(v) == 2 and _is_int(v[0])), "null or (step, accuracy)"),
                    "evals_since_best": int},
    "algo?": (dict, type(None)),
    "kl_coef?": (float, type(None)),
    "algo_name?": str,
}
TRAINER = {"optimizer": {"state": dict, "param_groups": ListOf(dict)}, "scheduler": dict,
           "lora?": dict, "critic?": dict,
           "master?": ListOf(Where(torch.is_tensor, "a tensor (the float32 master of one trained weight)"))}
METRIC_LINE = {"step": Where(lambda v: _is_int(v) and v >= 1, "a step number >= 1")}


def check_fits(ckpt: Path, algo: str, needs_values: bool, lora: bool, master: bool) -> None:
    """ConfigError when an intact checkpoint is of another kind of run than the one resuming it:
    another algorithm (named: state.pt records it), a critic where this run has none (or none where
    it needs one), LoRA adapters where it trains in full, float32 masters it does not keep."""
    state = load_state(ckpt)
    trainer = _trainer_keys(ckpt)
    theirs = state.get("algo_name")
    if theirs is not None and theirs != algo:
        raise ConfigError(f"{ckpt}: a checkpoint of a {theirs} run (state.pt: algo_name), and this run is "
                          f"{algo} (algo.name); resume it with its own config, or start a new run")
    for key, ours, what in (("critic", needs_values, "a critic (value head)"), ("lora", lora, "LoRA adapters"),
                            ("master", master, "float32 master weights (trainer.param_dtype=bfloat16)")):
        if (key in trainer) != ours:
            raise ConfigError(f"{ckpt}/trainer.pt: {key}: {'present' if key in trainer else 'absent'} ({what}), and "
                              f"this run ({algo}) {'needs it' if ours else 'has none'}; was it written by another kind "
                              "of run?")


def _trainer_keys(ckpt: Path) -> set[str]:
    """trainer.pt's top-level keys, checked against its schema, without reading the optimizer's
    moments into memory (memory-mapped)."""
    try:
        trainer = torch.load(ckpt / "trainer.pt", map_location=device.CPU, weights_only=False, mmap=True)
    except RuntimeError:  # a legacy (non-zip) file cannot be mapped: read it
        trainer = torch.load(ckpt / "trainer.pt", map_location=device.CPU, weights_only=False)
    check(trainer, TRAINER, f"{ckpt.name}/trainer.pt")
    return set(trainer)


@contextmanager
def fitting(step: int):
    """Around putting a checkpoint's state back into a run (the RL loop's, an offline run's): state that fits
    its schema but not this run (an optimizer of other parameters, another task mix) is one ConfigError
    naming the checkpoint; a field its schema refused is named already and passes as it is."""
    try:
        yield
    except ConfigError:
        raise
    except (KeyError, ValueError, TypeError, RuntimeError, IndexError) as e:
        what = str(e).splitlines()[0] if str(e) else ""
        raise ConfigError(f"checkpoint step_{step:06d}: its trainer.pt or state.pt does not fit this run "
                          f"({type(e).__name__}: {what}); was it written by another kind of run?") from None


def load_into(model: torch.nn.Module, weights: dict, source: str) -> None:
    """model.load_state_dict(weights), after checking every tensor's name and shape: a checkpoint
    of another model is one ConfigError naming ``source`` and the first tensor that differs."""
    want = model.state_dict()
    missing = [k for k in want if k not in weights]
    unexpected = [k for k in weights if k not in want]
    shapes = [k for k in want if k in weights and tuple(want[k].shape) != tuple(weights[k].shape)]
    for names, what in ((missing, "missing"), (unexpected, "not in the model"), (shapes, "of another shape")):
        if names:
            more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
            shape = (f": {tuple(weights[names[0]].shape)} there, {tuple(want[names[0]].shape)} in the model"
                     if what == "of another shape" else "")
            raise ConfigError(f"{source}: tensor {names[0]} is {what}{shape}{more}; were these weights written "
                              "for another model (model.name)?")
    model.load_state_dict(weights)


def load_weights(ckpt: Path) -> dict:
    """The policy's weights alone (what an export writes), unverified: not the trainer state,
    whose optimizer moments are twice the weights' size."""
    return load_file(ckpt / "model.safetensors")


def load_trainer_state(ckpt: Path) -> dict:
    """The trainer's state (optimizer, LoRA adapters, critic), checked against its schema."""
    return check(torch.load(ckpt / "trainer.pt", map_location=device.CPU, weights_only=False), TRAINER,
                 f"{ckpt.name}/trainer.pt")


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
            except ConfigError as e:  # a field that does not fit its schema: named
                problem = str(e)
            except Exception as e:  # noqa: BLE001 - a file that passed (or had no) checksums but does not load
                problem = f"it does not load ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        _report(found, i, problem)
    return None
