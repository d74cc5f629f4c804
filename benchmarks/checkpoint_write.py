"""A checkpoint's write, before (every file hashed after all are written) and now (each synced and hashed on a
second thread while the next is written), on a 0.5B-sized state: 2.1 GB of fp32 weights, 4.2 GB of AdamW moments.

    .venv/bin/python benchmarks/checkpoint_write.py 4       # 4 turns of each, alternating; ~3 min, ~13 GB of RAM

Prints each turn and the medians (benchmarks/README.md, "checkpoint_write.py")."""

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from rlpost.model import checkpoint

LAYERS, NUMBERS = 24, 22_000_000  # 24 tensors of 88 MB: 2.1 GB of weights, twice that of moments


def before(folder: Path, step: int, model_state: dict, trainer_state: dict, state: dict, metrics: list) -> None:
    """checkpoint._write as it was: every file written, then each synced and hashed."""
    save_file(checkpoint.unshared(model_state), folder / "model.safetensors")
    with open(folder / "trainer.pt", "wb") as f:
        torch.save(trainer_state, f)
    with open(folder / "state.pt", "wb") as f:
        torch.save(state, f)
    with open(folder / "metrics.jsonl", "w") as f:
        f.write("".join(json.dumps(m) + "\n" for m in metrics))
    names = checkpoint.FILES + checkpoint.EXTRA
    for name in names:
        with open(folder / name, "rb") as fh:
            os.fsync(fh.fileno())
    files = {n: {"bytes": (folder / n).stat().st_size, "sha256": checkpoint.sha256(folder / n)} for n in names}
    checkpoint.write_atomic(folder / checkpoint.MANIFEST, json.dumps({"step": step, "files": files}, indent=1) + "\n")


def main() -> None:
    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    torch.manual_seed(0)
    model = {f"layer{i}.w": torch.randn(NUMBERS) for i in range(LAYERS)}
    moments = {i: {"exp_avg": torch.randn(NUMBERS), "exp_avg_sq": torch.rand(NUMBERS)} for i in range(LAYERS)}
    trainer = {"optimizer": {"state": moments}}
    root = Path(tempfile.mkdtemp())
    times: dict[str, list[float]] = {"before": [], "now": []}
    ways = [("before", before), ("now", checkpoint._write)]
    try:
        for turn in range(turns):
            for name, write in ways if turn % 2 == 0 else ways[::-1]:
                folder = root / f"{name}{turn}"
                folder.mkdir()
                t = time.perf_counter()
                write(folder, 2, model, trainer, {"step": 2}, [{"step": 2}])
                times[name].append(time.perf_counter() - t)
                shutil.rmtree(folder)
                print(f"{name}: {times[name][-1]:.2f} s", flush=True)
    finally:
        shutil.rmtree(root)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"median before {med['before']:.2f} s, now {med['now']:.2f} s, now / before {med['now'] / med['before']:.2f}")


if __name__ == "__main__":
    main()
