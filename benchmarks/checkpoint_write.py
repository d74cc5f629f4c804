"""A checkpoint's write, before (every file hashed after all are written) and now (each synced and hashed on a
second thread while the next is written), on a 0.5B-sized state: 2.1 GB of fp32 weights, 4.2 GB of AdamW moments.

    .venv/bin/python benchmarks/checkpoint_write.py 4       # 4 turns of each, alternating; ~3 min, ~13 GB of RAM

Prints each turn and the medians (benchmarks/README.md, "checkpoint_write.py")."""
import json, os, sys, time, tempfile, shutil, torch
from pathlib import Path
from rlpost.model import checkpoint as c
from safetensors.torch import save_file

def old_write(folder, step, model_state, trainer_state, state, metrics):
    save_file(c.unshared(model_state), folder / "model.safetensors")
    with open(folder / "trainer.pt", "wb") as f:
        torch.save(trainer_state, f)
    with open(folder / "state.pt", "wb") as f:
        torch.save(state, f)
    with open(folder / "metrics.jsonl", "w") as f:
        f.write("".join(json.dumps(m) + "\n" for m in metrics))
    names = c.FILES + c.EXTRA
    for name in names:
        with open(folder / name, "rb") as fh:
            os.fsync(fh.fileno())
    files = {name: {"bytes": (folder / name).stat().st_size, "sha256": c.sha256(folder / name)} for name in names}
    c.write_atomic(folder / c.MANIFEST, json.dumps({"step": step, "files": files}, indent=1) + "\n")

torch.manual_seed(0)
n = 24
model = {f"layer{i}.w": torch.randn(22_000_000) for i in range(n)}
trainer = {"optimizer": {"state": {i: {"exp_avg": torch.randn(22_000_000), "exp_avg_sq": torch.rand(22_000_000)} for i in range(n)}}}
root = Path(tempfile.mkdtemp(dir="/tmp"))
res = {"before": [], "after": []}
for r in range(int(sys.argv[1])):
    for name, fn in (("before", old_write), ("after", c._write)) if r % 2 == 0 else (("after", c._write), ("before", old_write)):
        d = root / f"{name}{r}"; d.mkdir()
        t = time.perf_counter(); fn(d, 2, model, trainer, {"step": 2}, [{"a": 1}]); res[name].append(time.perf_counter() - t)
        m = json.loads((d / c.MANIFEST).read_text())
        shutil.rmtree(d)
        print(name, f"{res[name][-1]:.2f} s", flush=True)
shutil.rmtree(root)
import statistics as st
print({k: round(st.median(v), 2) for k, v in res.items()}, "after/before", round(st.median(res["after"]) / st.median(res["before"]), 2))
