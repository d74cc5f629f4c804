"""How one GRPO step's cost grows with completion length, group size and model size.

    .venv/bin/python benchmarks/scaling.py                    # 9 runs x 2 steps; ~20 min on 2 quiet AVX2 cores,
                                                              # + ~12 for length_to_cap
    .venv/bin/python benchmarks/scaling.py --steps 3 --only length   # one axis; the others' rows are kept
    .venv/bin/python benchmarks/scaling.py --replan           # today's planner against the recorded runs, no run

One axis at a time around a base of 2 prompts x 8 completions, at most 256 new tokens, on
reasoning-gym's basic_arithmetic with its chain-of-thought system prompt (task.name=gym: "think
step by step", then <answer>...</answer>), so completions run long:

* completion length: rollout.max_new_tokens = 64, 256, 1024 (embedded 135M, group 8);
* group size: rollout.group_size = 4, 8, 16 (embedded 135M, 256 tokens);
* model size: the embedded SmolLM2-135M and a random-initialised Llama of SmolLM2-360M's shape
  (960 wide, 32 layers, 15 heads / 5 KV heads, 2560 MLP, tied 49152 vocab), 256 tokens, group 8.
  The random model never says EOS, so its completions always run to the cap;
* completion length to the cap (length_to_cap): 64, 256, 1024 new tokens on a random-initialised
  model of the embedded shape, which never says EOS either, so the length is the cap (the embedded
  model stops at ~150-500 tokens whatever the cap).

Each configuration is one `rlpost train` process (the real CLI, precision as the probe picks it,
no evaluation, no checkpoints); its figures are the median over steps 2..N (step 1 warms up):
step time, generation tokens/s, update time, and the process's peak RSS. Beside each measured
figure is the planner's prediction for the same run (``rlpost plan --from RUN_DIR``: this CPU's
probed peaks and the run's own prompt and completion lengths). Per axis, the exponent b of
time ~ x^b is fitted by least squares on logs, for the measurement and for the planner, so
growth faster than the arithmetic says stands out.
Writes benchmarks/results/scaling-<isa>.{json,md}. ``--replan`` reads that JSON back and prints the
planner's generation time for each recorded run as the planner stands now (after a formula change),
with measured / predicted; rows recorded before their prompt length was saved take ``--prompt-len``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import machine  # benchmarks/machine.py: where the figures came from

HERE = Path(__file__).resolve().parent
BASE = {"prompts": 2, "group": 8, "tokens": 256, "model": "embedded"}
AXES = {  # axis: (config key varied, values, what else differs from BASE)
    "length": ("tokens", [64, 256, 1024], {}),
    "group": ("group", [4, 8, 16], {}),
    "model": ("model", ["embedded", "random-360m"], {}),
    # The embedded model says EOS long before 1024 tokens; a random-initialised model of the same
    # shape never does, so every row runs to the cap and the length is what the axis says.
    "length_to_cap": ("tokens", [64, 256, 1024], {"model": "random-135m"}),
}
# SmolLM2-360M's shape (its config.json on the HF hub), for the random-initialised model.
SHAPE_360M = dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
                  num_key_value_heads=5, head_dim=64)
RANDOM = {"random-360m": SHAPE_360M, "random-135m": {}}  # {}: the embedded model's own shape


def random_model(folder: Path, shape: dict) -> Path:
    """A transformers folder with a random-initialised Llama of the embedded config updated by
    ``shape``, and the embedded tokenizer."""
    if (folder / "model.safetensors").exists():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlpost.model.load import embedded_model_dir, load_tokenizer, save_model

    base = json.loads((embedded_model_dir() / "config.json").read_text())
    cfg = LlamaConfig(**{**{k: v for k, v in base.items() if not k.startswith("_")}, **shape})
    torch.manual_seed(0)
    save_model(LlamaForCausalLM(cfg), load_tokenizer("embedded"), folder)
    return folder


def overrides(c: dict, steps: int, out: Path, name: str) -> list[str]:
    m = c["model"]
    model = str(random_model(HERE / ".cache" / f"llama-{m.split('-')[1]}-random", RANDOM[m])) if m in RANDOM else m
    return [f"model.name={model}", "task.name=gym", "task.n_heldout=1", "task.n_train=200",
            f"rollout.prompts_per_step={c['prompts']}", f"rollout.group_size={c['group']}",
            f"rollout.max_new_tokens={c['tokens']}", f"run.steps={steps}", "run.eval_every=0",
            "run.eval_n=1", "run.checkpoint_every=0", "run.progress=false", f"run.out_dir={out}", f"run.name={name}",
            "trainer.micro_batch_size=8"]


def run_one(c: dict, steps: int) -> dict:
    """One `rlpost train` process; medians over steps 2..N and the planner's prediction."""
    out = Path(tempfile.mkdtemp(prefix="scaling-"))
    name = f"{c['model']}-g{c['group']}-t{c['tokens']}"
    proc = subprocess.run([sys.executable, "-m", "rlpost.cli", "train", *overrides(c, steps, out, name)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    run_dir = out / name
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    later = [m for m in rows if "timing_s/update" in m][1:] or rows
    med = lambda k: statistics.median(m[k] for m in later)
    summary = json.loads((run_dir / "summary.json").read_text())
    from rlpost.observe import planner

    cal = planner.calibrate(run_dir, "cpu")
    shutil.rmtree(out)  # RUN/model alone is 0.5-1.4 GB a row; the table needs only the figures above
    pred = {r["name"]: r["predicted"] for r in cal["rows"]}
    gen_tokens = med("response_length/mean") * c["prompts"] * c["group"]
    return {**c, "params": cal["plan"]["params"], "step_s": med("timing_s/step"), "gen_s": med("timing_s/gen"),
            "update_s": med("timing_s/update"), "gen_tok_s": med("perf/gen_tokens_per_s"),
            "mean_len": med("response_length/mean"), "prompt_len": med("prompt_length/mean"),
            "max_len": med("response_length/max"), "gen_tokens": gen_tokens, "peak_rss_gb": summary["peak_rss_gb"],
            "pred_step_s": pred["timing_s/step"], "pred_gen_s": pred["timing_s/gen"],
            "pred_update_s": pred["timing_s/update"], "pred_peak_gb": pred["peak memory"],
            "pred_gen_tok_s": gen_tokens / pred["timing_s/gen"]}


def exponent(xs: list[float], ys: list[float]) -> float:
    """b in y = a x^b, least squares on logs."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.mean(lx), statistics.mean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def fit_x(axis: str, r: dict) -> float:
    """The axis' x for the fit: the cap for length, the group size, the parameter count for model."""
    return float(r["params"] if axis == "model" else r[AXES[axis][0]])


def report(results: dict, steps: int) -> str:
    lines = [f"Base: 2 prompts x 8, <= 256 new tokens, gym basic_arithmetic with chain of thought; medians of steps "
             f"2..{steps}; (planner's prediction) beside each figure.", ""]
    for axis, rows in results.items():
        key = AXES[axis][0]
        lines += [f"**{axis}** ({key})", "",
                  f"| {key} | mean / max completion | step s | generation tok/s | update s | peak RSS GiB |",
                  "|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r[key]} | {r['mean_len']:.0f} / {r['max_len']:.0f} | {r['step_s']:.1f} "
                         f"({r['pred_step_s']:.1f}) | {r['gen_tok_s']:.0f} ({r['pred_gen_tok_s']:.0f}) | "
                         f"{r['update_s']:.1f} ({r['pred_update_s']:.1f}) | {r['peak_rss_gb']:.2f} "
                         f"({r['pred_peak_gb']:.2f}) |")
        xs = [fit_x(axis, r) for r in rows]
        fits = {k: (exponent(xs, [r[k] for r in rows]), exponent(xs, [r["pred_" + k] for r in rows]))
                for k in ("step_s", "gen_s", "update_s")}
        lines += ["", "exponent b of time ~ x^b, measured (planner): " +
                  ", ".join(f"{k[:-2]} {m:.2f} ({p:.2f})" for k, (m, p) in fits.items())]
        if axis.startswith("length"):  # per completion token: flat if decode cost did not grow with the context
            per_tok = [1e3 * r["gen_s"] / r["gen_tokens"] for r in rows]
            lines.append("generation ms per completion token: " + ", ".join(f"{p:.1f}" for p in per_tok) +
                         " (exponent against mean completion length "
                         f"{exponent([r['mean_len'] for r in rows], per_tok):.2f})")
        lines.append("")
    return "\n".join(lines)


def replan(prompt_len: int | None) -> None:
    """Measured / predicted generation time of every recorded row, with today's planner on this CPU."""
    from rlpost.observe import planner

    from rlpost.model import precision

    dev, bf16 = planner.probed_cpu(), precision.choose().bf16
    wide = planner.Shape(layers=SHAPE_360M["num_hidden_layers"], hidden=SHAPE_360M["hidden_size"],
                         intermediate=SHAPE_360M["intermediate_size"], heads=SHAPE_360M["num_attention_heads"],
                         kv_heads=SHAPE_360M["num_key_value_heads"], vocab=planner.EMBEDDED.vocab, tied=True,
                         head_dim=SHAPE_360M["head_dim"])
    results = json.loads((machine.RESULTS / f"scaling-{machine.isa_tag()}.json").read_text())
    print("| axis | value | gen s | predicted s | measured / predicted |\n|---|---|---|---|---|")
    for axis, rows in results.items():
        for r in rows:
            p = r.get("prompt_len") or prompt_len
            if p is None:
                raise SystemExit(f"--replan: the {axis} row {r[AXES[axis][0]]} has no prompt length: give --prompt-len")
            w = planner.Workload(prompts=r["prompts"], group=r["group"], prompt_len=math.ceil(p),
                                 new_tokens=r["tokens"], response_len=math.ceil(r["max_len"]),
                                 mean_response_len=r["mean_len"],
                                 # what the probe picks on this kind: the runs' dtype
                                 sampler_bf16=bf16, trainer_bf16=bf16)
            pred = planner.rollout_time(wide if r["model"] == "random-360m" else planner.EMBEDDED, w, dev)
            print(f"| {axis} | {r[AXES[axis][0]]} | {r['gen_s']:.1f} | {pred:.1f} | {r['gen_s'] / pred:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--only", choices=list(AXES), action="append", help="run only this axis (repeatable)")
    ap.add_argument("--replan", action="store_true", help="no run: today's planner against the recorded results")
    ap.add_argument("--prompt-len", type=int, help="--replan: prompt tokens of rows recorded without theirs")
    args = ap.parse_args()
    if args.replan:
        return replan(args.prompt_len)
    header, done, results = machine.Header(), {}, {}
    for axis in args.only or list(AXES):
        key, values, other = AXES[axis]
        results[axis] = []
        for v in values:
            c = {**BASE, **other, key: v}
            tag = json.dumps(c, sort_keys=True)
            if tag not in done:  # the base configuration serves all three axes
                print(f"{axis}: {key}={v} ...", flush=True)
                done[tag] = run_one(c, args.steps)
            results[axis].append(done[tag])
    old, kept = machine.RESULTS / f"scaling-{machine.isa_tag()}.json", ""
    if args.only and old.exists():  # one axis run again: the others keep their recorded rows, and say whence
        before = {k: v for k, v in json.loads(old.read_text()).items() if k in AXES and k not in results}
        results, first = {**before, **results}, old.with_suffix(".md").read_text().splitlines()[0]
        kept = (f"The {', '.join(before)} rows are kept from the run before, whose header was: {first}\n\n" if before
                else "")
    text = kept + report(results, args.steps)
    print(text)
    machine.write_results("scaling", results, header, text)


if __name__ == "__main__":
    main()
