"""A run's weights as a folder that plain transformers, vLLM and llama.cpp's converter read.

Every run ends by writing ``RUN/model`` from its last checkpoint (recipes/rl.py; ``rlpost sft|rm|dpo``
write theirs directly), and ``rlpost export RUN [--step N] [--out DIR] [--merge-lora]`` writes one
from any checkpoint that is still on disk (recipes/export.py: export_run, which reads the run's config; this
module takes its model section and seed).

``rlpost export`` never writes into the run it reads from: its default output is a folder beside
the run (``RUN-model``, ``RUN-model_step_N``, ``RUN-adapter``), and ``--out`` must be a new or
empty folder, or one an earlier export wrote (types/folders.py: the marker ``.rlpost`` lists the
files it wrote; a file added beside them refuses the folder). The folder is written under a
temporary name and renamed into place, so a failed export leaves the old one whole. The folder is what
``save_pretrained`` writes: config.json, generation_config.json (with the EOS and pad ids the sampler used), the
tokenizer with its chat template (the plain fallback one for a base model, so the folder generates the same
prompts rlpost trained on), and model.safetensors in float32 (the trainer's master weights, so a
reload gives the same greedy tokens as ``rlpost eval``). ``model.name=RUN`` loads it.

A checkpoint holds the policy under the plain model's key names, LoRA adapters already folded in
(model/lora.py), so the default folder is always a full model. ``rlpost export`` of a LoRA run
without ``--merge-lora`` writes the adapters alone instead (peft's adapter_config.json +
adapter_model.safetensors, from the trainer state), for ``peft.AutoPeftModelForCausalLM`` or
vLLM's ``--enable-lora``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rlpost import config
from rlpost.model import checkpoint, device, lora
from rlpost.model.load import load_policy, save_model
from rlpost.types import folders
from rlpost.types.errors import ConfigError, RunError, writing


def find_checkpoint(run_dir: Path, step: int | None) -> Path | None:
    """The checkpoint of `step` (None: the newest intact one); None when the run keeps no checkpoints."""
    if step is None:
        return checkpoint.newest_intact(run_dir)
    ckpt = Path(run_dir) / "checkpoints" / f"step_{step:06d}"
    if not ckpt.is_dir():
        kept = sorted(checkpoint.step_of(p) for p in checkpoint.candidates(run_dir))
        raise ConfigError(f"--step {step}: {run_dir} keeps no checkpoint of that step (kept: "
                          f"{', '.join(map(str, kept)) or 'none'}; run.keep_checkpoints sets how many stay)")
    problem = checkpoint.verify(ckpt)
    if problem is not None:
        raise ConfigError(f"--step {step}: {ckpt} is damaged ({problem}); export another step")
    return ckpt


def write_model(run_dir: Path, model: config.ModelConfig, seed: int, step: int | None = None, out: Path | None = None,
                merge_lora: bool = True) -> Path:
    """Write a checkpoint of `run_dir` (trained from ``model`` with run.seed ``seed``) as a transformers
    folder, or as a peft adapter folder for a LoRA run with merge_lora=False; returns the folder."""
    if merge_lora:
        return staged(run_dir, model, seed, step, out)[2]()
    run_dir = Path(run_dir)
    ckpt = checkpoint_to_export(run_dir, step)
    if ckpt is None:  # no checkpoints of its own (rsft, online DPO: its rounds' are in round_N/): its adapter is final
        return copy_final(run_dir, out, "adapter")
    out = Path(out) if out else in_run(run_dir, "adapter", step)
    loaded = load_policy(model.name, dtype=torch.float32, seed=seed)
    # The adapters on the run's base: the same wrap as the trainer's, then its saved adapter tensors.
    peft_model = lora.wrap(loaded.model, model, seed)
    adapters = checkpoint.load_trainer_state(ckpt).get("lora")
    if adapters is None:
        raise ConfigError(f"{ckpt}/trainer.pt: lora: missing; the checkpoint holds no LoRA adapters")
    missing = peft_model.load_state_dict(adapters, strict=False)
    if missing.unexpected_keys:
        raise ConfigError(f"{ckpt}/trainer.pt: lora: {missing.unexpected_keys[0]} is not an adapter of this model")
    return lora.save_adapter(peft_model, loaded.tokenizer, out)


def checkpoint_to_export(run_dir: Path, step: int | None) -> Path | None:
    """find_checkpoint, refusing a run whose checkpoints are all damaged (None: it keeps none)."""
    ckpt = find_checkpoint(run_dir, step)
    if ckpt is None and checkpoint.candidates(run_dir, quiet=True):  # every one damaged: said above, one by one
        raise ConfigError(f"{run_dir}: no intact checkpoint to export (each was passed over above); RUN/model, when "
                          "there is one, holds the run's final model as it is")
    return ckpt


def in_run(run_dir: Path, name: str, step: int | None) -> Path:
    """The default folder inside the run: RUN/model, RUN/model_step_N, RUN/adapter, RUN/adapter_step_N."""
    return run_dir / (name + ("" if step is None else f"_step_{step}"))


def staged(run_dir: Path, model: config.ModelConfig, seed: int, step: int | None = None, out: Path | None = None,
           head: bool = False):
    """A full export split in two, so that a caller can use the loaded model before (or while) it is written:
    (the folder, the merged model (load.Loaded; None for a run without checkpoints, whose final folder is
    copied), a function that writes the folder and returns it). ``head``: a reward model's run (rlpost rm),
    whose folder carries its scalar head (``value_head``)."""
    run_dir = Path(run_dir)
    ckpt = checkpoint_to_export(run_dir, step)
    if ckpt is None:  # no checkpoints of its own (rsft, online DPO: its rounds' are in round_N/): its model is final
        return Path(out) if out else run_dir / "model", None, lambda: copy_final(run_dir, out, "model")
    out = Path(out) if out else in_run(run_dir, "model", step)
    loaded = merged(ckpt, model, seed)
    return out, loaded, lambda: save_model(loaded.model, loaded.tokenizer, out, value_head(ckpt) if head else None)


def value_head(ckpt: Path) -> torch.nn.Linear:
    """A reward model's scalar head (Linear(hidden, 1)) from checkpoint ``ckpt``: trainer.pt's critic, whose
    trunk is the policy (read memory-mapped: the optimizer's moments beside it are not loaded)."""
    critic = torch.load(ckpt / "trainer.pt", map_location=device.CPU, weights_only=False, mmap=True).get("critic") or {}
    weight, bias = critic.get("head.weight"), critic.get("head.bias")
    if weight is None or bias is None:
        raise ConfigError(f"{ckpt}/trainer.pt: critic: no scalar head (head.weight, head.bias); was it written by "
                          "rlpost rm?")
    head = torch.nn.Linear(weight.shape[1], 1)
    head.load_state_dict({"weight": weight.float(), "bias": bias.float()})
    return head


def merged(ckpt: Path, model: config.ModelConfig, seed: int):
    """The model a full export of checkpoint ``ckpt`` writes (load.Loaded): ``model``'s starting policy in
    float32 with the checkpoint's weights loaded into it (LoRA adapters are folded in already). The weights
    alone are read: the optimizer's moments in trainer.pt would double the memory this needs."""
    loaded = load_policy(model.name, dtype=torch.float32, seed=seed)
    checkpoint.load_into(loaded.model, checkpoint.load_weights(ckpt), f"{ckpt}/model.safetensors")
    return loaded


def copy_final(run_dir: Path, out: Path | None, name: str) -> Path:
    src = run_dir / name
    if not (src / "config.json").exists() and not (src / "adapter_config.json").exists():
        what = "LoRA adapters (model.lora_r was 0)" if name == "adapter" else "checkpoint or model/ folder"
        raise ConfigError(f"{run_dir}: no {what} to export; is it a finished run folder?")
    if out is None or Path(out).resolve() == src.resolve():
        return src
    shutil.copytree(src, out, dirs_exist_ok=True)
    return Path(out)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cast_folder(folder: Path, dtype: str) -> Path:
    """The floating-point tensors of every safetensors file in ``folder`` (a model, its value head, or
    peft adapters) cast to ``dtype``, and config.json saying so; float32 leaves the folder as it is.
    A finite weight the cast would make inf (float16 holds |x| <= 65504; bfloat16 has float32's
    range but for its last 0.2%) refuses the export, naming the tensor, before any file changes:
    each file is cast beside itself and the casts replace the files only once all of them passed."""
    if dtype == "float32":
        return folder
    cast = []
    try:
        for file in sorted(Path(folder).glob("*.safetensors")):
            tensors = {k: cast_tensor(v, dtype, f"{file.name}: {k}") for k, v in load_file(file).items()}
            cast.append((file.with_name(file.name + ".cast"), file))
            save_file(tensors, cast[-1][0], metadata={"format": "pt"})
        for new, file in cast:
            os.replace(new, file)
    finally:
        for new, _ in cast:
            new.unlink(missing_ok=True)
    meta = Path(folder) / "config.json"
    if meta.is_file():  # transformers reads `dtype` (older versions `torch_dtype`) as the weights' own
        data = json.loads(meta.read_text())
        data["torch_dtype" if "torch_dtype" in data and "dtype" not in data else "dtype"] = dtype
        meta.write_text(json.dumps(data, indent=2) + "\n")
    return folder


def cast_tensor(value: torch.Tensor, dtype: str, name: str) -> torch.Tensor:
    """``value`` in ``dtype`` (a float tensor; others as they are); ConfigError naming ``name`` when a
    finite value of it would become inf there."""
    if not value.is_floating_point():
        return value
    out = value.to(DTYPES[dtype])
    overflow = torch.isinf(out) & torch.isfinite(value)
    if overflow.any():
        raise ConfigError(f"--dtype {dtype}: {name} has {int(overflow.sum())} weight(s) past {dtype}'s range "
                          f"(|value| up to {value[overflow].abs().max().item():.6g}; {dtype} holds at most "
                          f"{torch.finfo(DTYPES[dtype]).max:.6g}): they would be inf. Export in float32"
                          + (" or bfloat16 (float32's range)" if dtype == "float16" else "") + "; nothing was written")
    return out


def default_out(run_dir: Path, step: int | None, merge: bool) -> Path:
    """Beside the run: RUN-model, RUN-model_step_N, RUN-adapter, RUN-adapter_step_N."""
    return run_dir.parent / f"{run_dir.name}-{'model' if merge else 'adapter'}{'' if step is None else f'_step_{step}'}"


def publish(out: Path, write) -> Path:
    """``write(tmp)`` into a new temporary folder beside ``out``, the export marker listing what it
    wrote, then renamed to ``out`` (which held nothing, or only an earlier export's files)."""
    with writing(out):  # a full disk, a read-only folder: one line naming the folder and the file
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.export-"))
        try:
            folder = Path(write(tmp / "out"))
            folders.mark(folder, "export", files=sorted(os.listdir(folder)))
            if out.exists():
                shutil.rmtree(out)  # empty, or an earlier export's own files (checked by the caller)
            os.replace(folder, out)
        except RunError as e:  # a write refused inside the temporary folder (save_model's line): named as `out`
            raise RunError(str(e).replace(str(tmp / "out"), str(out))) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out
