"""`rlpost export`: a run's checkpoint as a transformers folder, from the run's own config.

The run folder's config.yaml says how the run was trained (model, LoRA, seed); reading a whole config is a
recipe's business (docs/design.md: the layers), so this is here, and model/export.py writes the folder from
the model section and the seed alone.
"""

from __future__ import annotations

from pathlib import Path

from rlpost import runconfig
from rlpost.model import checkpoint
from rlpost.observe import runfolder
from rlpost.model.export import cast_folder, copy_final, default_out, publish, staged, write_model
from rlpost.types import folders
from rlpost.types.errors import ConfigError


def export_run(run_dir: str | Path, step: int | None = None, out: str | Path | None = None,
               merge_lora: bool = False, dtype: str = "float32") -> Path:
    """`rlpost export`: the run's own config says how it was trained. Nothing in ``run_dir`` is
    written; the output goes to ``out`` or a folder beside the run (``default_out``), its weights
    in ``dtype`` (``cast_folder``: bfloat16 halves the folder for serving)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"RUN_DIR {run_dir}: no config.yaml there; is it a run folder?")
    cfg = runconfig.load_run(run_dir)[0]
    if merge_lora and cfg.model.lora_r == 0:
        raise ConfigError(f"--merge-lora: {run_dir} is a full fine-tune (model.lora_r=0); there are no adapters to "
                          "merge")
    merge = merge_lora or cfg.model.lora_r == 0
    if out is None and step is None and dtype == "float32" and not checkpoint.candidates(run_dir, quiet=True):
        return copy_final(run_dir, None, "model" if merge else "adapter")  # rsft, online DPO: their final folder
    out = Path(out) if out is not None else default_out(run_dir, step, merge)
    if folders.inside(out, run_dir) or folders.inside(run_dir, out):
        raise ConfigError(f"--out {out}: {'inside' if folders.inside(out, run_dir) else 'holds'} the run folder it "
                          f"exports from ({run_dir}); rlpost export never writes there: pick a folder outside it")
    folders.check_folder(out, "export", "--out")
    head = runfolder.made_by(run_dir) == "rm"  # a reward model: its folder carries the scalar head

    def write(tmp: Path) -> Path:
        if merge:
            return staged(run_dir, cfg.model, cfg.run.seed, step, tmp, head)[2]()
        return write_model(run_dir, cfg.model, cfg.run.seed, step, tmp, merge_lora=False)

    return publish(out, lambda tmp: cast_folder(write(tmp), dtype))
