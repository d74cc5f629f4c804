"""Does training on `rlpost curate`'s output reach the uncurated run's final held-out accuracy in fewer steps?

    .venv/bin/python benchmarks/curate_demo.py [--seeds 1,2] [--steps 25] [--out /tmp/curate_demo]

The demo task written out as data (its 4000 generated training rows, repeats included, and its 200
held-out rows, as `prompt` / `answer` JSONL, scored by the demo's verifier `rlpost.envs.arithmetic:score`),
then `rlpost curate` on the training rows with the base model (8 samples a prompt, band 0.1-0.9, the
held-out rows kept out), then for each seed one GRPO run of the demo's settings on each file, held-out
accuracy every 5 steps. Per seed: the uncurated run's final accuracy, and the first evaluated step at
which each run reached it. Writes results/curate_demo.{json,md}. Each training run takes the demo's ~7 min
on 2 idle cores of the AVX-512 kind; curate's 710 distinct prompts x 8 samples did not finish in 25 min on 2
cores shared with other jobs (benchmarks/README.md), so give it an idle machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = ["task.name=dataset", "task.verifier=rlpost.envs.arithmetic:score", "rollout.max_new_tokens=16"]


def rlpost(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "rlpost.cli", *args], check=True)


def curve(run: Path) -> list[tuple[int, float]]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(x["step"], x["eval/heldout_accuracy"]) for x in lines if "eval/heldout_accuracy" in x]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--out", default="/tmp/curate_demo")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from rlpost import config
    from rlpost.envs import arithmetic

    train, heldout = arithmetic.build_splits(config.load(None, []).task)
    for name, rows in (("arith_train.jsonl", train), ("arith_heldout.jsonl", heldout)):
        (out / name).write_text("".join(json.dumps({"prompt": r["messages"][-1]["content"], "answer": r["answer"]})
                                        + "\n" for r in rows))
    curated = out / "arith_train.jsonl.curated"
    if not (curated / "report.json").exists():
        rlpost("curate", str(out / "arith_train.jsonl"), "--heldout", str(out / "arith_heldout.jsonl"),
               "--out", str(curated), *DATA, "run.progress=false")
    result = {"curate": json.loads((curated / "report.json").read_text()), "seeds": {}}
    for seed in args.seeds.split(","):
        runs = {}
        for kind, data in (("uncurated", out / "arith_train.jsonl"), ("curated", curated / "arith_train.jsonl")):
            run = out / "runs" / f"{kind}-{seed}"
            if not (run / "summary.json").exists():
                rlpost("train", *DATA, f"task.data={data}", f"task.eval_data={out / 'arith_heldout.jsonl'}",
                       f"run.steps={args.steps}", "run.eval_every=5", f"run.seed={seed}", "run.passk_eval=0",
                       f"run.out_dir={out / 'runs'}", f"run.name={kind}-{seed}", "run.progress=false")
            runs[kind] = curve(run)
        target = runs["uncurated"][-1][1]
        reach = {k: next((s for s, acc in c if acc >= target), None) for k, c in runs.items()}
        result["seeds"][seed] = {"target": target, "steps_to_target": reach, "curves": runs}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "curate_demo.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["| seed | uncurated final | uncurated reaches it at | curated reaches it at |", "|---|---|---|---|"]
    lines += [f"| {s} | {r['target']:.3f} | {r['steps_to_target']['uncurated']} | {r['steps_to_target']['curated']} |"
              for s, r in result["seeds"].items()]
    (HERE / "results" / "curate_demo.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
