"""Whether two runs are the same run, bit for bit: a refactor's proof that behaviour did not change.

Usage (from the repository root):
    python scripts/same_run.py record SRC OUT CONFIG   # run CONFIG with rlpost imported from SRC into OUT/CONFIG
    python scripts/same_run.py BEFORE AFTER            # compare two run folders, or two OUT folders config by config

``record`` runs ``rlpost train`` for 3 steps on a fixed seed with PYTHONPATH=SRC (e.g. a clone of the
commit before the change, ``git clone -q . /tmp/before``, then SRC=/tmp/before/src), with held-out
evaluation kept small. CONFIG is one of CONFIGS: the demo as it is (its packed trunk, the prompts run
once per mini-batch), transformers' forward with the prompts per micro-batch, and PPO (a separate
critic, a KL in the reward, two optimizer steps per batch).

The comparison reads every line of ``metrics.jsonl`` without its timing and memory fields (they
differ run to run whatever the code), and every tensor of ``model/*.safetensors`` as raw bytes.
It prints each difference and exits 1 if there is one, 0 if the runs are the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

COMMON = ["run.steps=3", "run.seed=0", "run.eval_n=8", "run.passk_eval=0", "run.eval_every=0", "run.threads=2",
          "run.progress=false", "run.checkpoint_every=0"]
CONFIGS = {
    "demo": [],
    "hf": ["trainer.forward=hf", "trainer.prompts_once=false", "trainer.micro_batch_size=16"],
    "ppo": ["algo.name=ppo", "algo.critic=separate", "algo.critic_lr=1e-4", "algo.kl_coef=0.01",
            "trainer.mini_batch_size=64", "algo.entropy_coef=0.01"],
}
# Fields that measure the machine, not the maths: wall-clock, memory, throughput.
VARYING = ("timing_s/", "time", "rss", "memory", "mem/", "tokens_per_s", "per_s", "s_per", "throughput", "wall")


def record(src: str, out: str, name: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
    args = [sys.executable, "-m", "rlpost", "train", *COMMON, *CONFIGS[name], f"run.out_dir={out}", f"run.name={name}"]
    return subprocess.run(args, env=env).returncode


def steady(line: dict) -> dict:
    return {k: v for k, v in line.items() if not any(part in k for part in VARYING)}


def tensors(folder: Path) -> dict:
    """{file:name: (dtype, shape, raw bytes)} of every tensor in ``folder``'s safetensors files."""
    import torch
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                t = st.get_tensor(k)
                raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                out[f"{f.name}:{k}"] = (str(t.dtype), tuple(t.shape), raw)
    return out


def compare(a: Path, b: Path) -> list[str]:
    diffs = []
    la = [steady(json.loads(x)) for x in (a / "metrics.jsonl").read_text().splitlines() if x.strip()]
    lb = [steady(json.loads(x)) for x in (b / "metrics.jsonl").read_text().splitlines() if x.strip()]
    if len(la) != len(lb):
        diffs.append(f"metrics.jsonl: {len(la)} lines against {len(lb)}")
    for i, (x, y) in enumerate(zip(la, lb)):
        for k in sorted(set(x) | set(y)):
            if x.get(k) != y.get(k):
                diffs.append(f"metrics.jsonl line {i + 1} {k}: {x.get(k)!r} against {y.get(k)!r}")
    ta, tb = tensors(a / "model"), tensors(b / "model")
    if not ta:
        diffs.append(f"{a / 'model'}: no safetensors")
    for k in sorted(set(ta) | set(tb)):
        if ta.get(k) != tb.get(k):
            diffs.append(f"model {k}: differs" if k in ta and k in tb else f"model {k}: in one run only")
    print(f"{a} vs {b}: {len(la)} metric lines, {len(ta)} tensors, {len(diffs)} differences")
    return diffs


def main(argv: list[str]) -> int:
    if argv and argv[0] == "record":
        return record(*argv[1:4])
    a, b = Path(argv[0]), Path(argv[1])
    pairs = [(a, b)] if (a / "metrics.jsonl").exists() else [(a / n, b / n) for n in CONFIGS if (a / n).exists()]
    diffs = [d for x, y in pairs for d in compare(x, y)]
    for d in diffs[:50]:
        print("  " + d)
    print("same" if not diffs else f"{len(diffs)} differences")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
