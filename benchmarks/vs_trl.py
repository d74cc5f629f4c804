"""rlpost against TRL's GRPOTrainer: same model, task and configuration, run alternately in one invocation.

    .venv/bin/python benchmarks/vs_trl.py                   # 2 rounds x (TRL, rlpost) x 6 steps, + the generate
                                                            # comparison
    .venv/bin/python benchmarks/vs_trl.py --rounds 1 --steps 3
    .venv/bin/python benchmarks/vs_trl.py --spincount 300000  # both children spin ~3 ms (a machine of one's own)

TRL is installed only for this benchmark, into benchmarks/.trl (pip --no-deps --target: its
dependencies, transformers, accelerate and datasets, are rlpost's own), and imported only by the
TRL child process. Each run is a child process, so its peak RSS is its own (os.wait4's
ru_maxrss); the order alternates each round so drift on a shared machine hits both sides.

Configuration, both sides: the embedded SmolLM2-135M-Instruct, the demo arithmetic task and its
verifier, 8 prompts x 4 completions per step, at most 64 new tokens, temperature 0.7, GRPO loss
(sequence mean of token means; TRL loss_type="grpo"), rewards centred and scaled by the group's
std, no KL (beta 0), one optimizer step per batch, AdamW lr 1e-5 constant, betas (0.9, 0.99),
grad clip 1.0, full fine-tune, no gradient checkpointing (TRL's default turns it on; it trades
update time for memory). Precision on both sides is what rlpost's start-up probe picks on this
machine (model/precision.py): bf16 autocast over float32 master weights and a bf16 sampler where
bf16 is fast (AVX-512 BF16), plain float32 where it is not (AVX2: TRL gets bf16=False too).
OpenMP waits as the environment says, the same for both children: by default GNU OpenMP's own
policy (spin ~300k iterations at a barrier, then sleep), TRL as its users run it and rlpost as it
ships since 2026-11-26 (it leaves the policy alone and moves its thread count instead:
model/cores.py). Runs from 2026-11-24 22:00 to 2026-11-26 gave both children rlpost's default then,
OMP_WAIT_POLICY=PASSIVE with GOMP_SPINCOUNT=1000 (``--spincount 1000`` reproduces it); runs before
that, PASSIVE alone. contention.py compares the wait policies beside a busy process.

Also measured, on the same 8 x 4 x 64 batch: tokens/s of rlpost's rollout engine against plain
transformers `generate` with the same weights' dtype (dynamic cache and static cache).
Writes benchmarks/results/vs_trl-<isa>.{json,md}, <isa> = this CPU's kind (avx2, avx512): the
figures of each kind stay side by side. ``--prompts/--group/--max-new`` change the shape (the
contention benchmark runs the children on the demo's 16 x 8 x 16).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine  # benchmarks/machine.py: where the figures came from

HERE = Path(__file__).resolve().parent
TRL_DIR = HERE / ".trl"
TRL_VERSION = "1.16.0"
PROMPTS, GROUP, MAX_NEW, TEMPERATURE, LR = 8, 4, 64, 0.7, 1e-5  # the defaults of --prompts, --group, --max-new


def ensure_trl() -> None:
    if (TRL_DIR / "trl" / "__init__.py").exists():
        return
    print(f"installing trl=={TRL_VERSION} into {TRL_DIR} (benchmark only)", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(TRL_DIR),
                    f"trl=={TRL_VERSION}"], check=True)


# ---------------------------------------------------------------------------------------------
# Children: one run each, results as JSON on the path given
# ---------------------------------------------------------------------------------------------


def child_trl(a: argparse.Namespace) -> None:
    sys.path.insert(0, str(TRL_DIR))
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlpost import config
    from rlpost.envs import arithmetic, build_task
    from rlpost.model import precision
    from rlpost.model.load import embedded_model_dir, load_tokenizer

    torch.set_num_threads(os.cpu_count())
    task = build_task(config.load(None, []).task)
    data = Dataset.from_list([{"prompt": r["messages"], "answer": r["answer"]} for r in task.train])

    def reward(prompts, completions, answer, **_):
        return [arithmetic.score(c[0]["content"], {"answer": a})[0] for c, a in zip(completions, answer)]

    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype=torch.float32)
    gen_s = [0.0]
    plain_generate = model.generate

    def timed_generate(*a, **k):
        t = time.perf_counter()
        try:
            return plain_generate(*a, **k)
        finally:
            gen_s[0] += time.perf_counter() - t

    model.generate = timed_generate
    steps_log: list[dict] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t, gen_s[0] = time.perf_counter(), 0.0

        def on_step_end(self, args, state, control, **kw):
            steps_log.append({"step_s": time.perf_counter() - self.t, "gen_s": gen_s[0]})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs and steps_log:
                steps_log[-1].update(reward=logs["reward"], mean_length=logs.get("completions/mean_length"))

    trl_dir = tempfile.mkdtemp()
    args = GRPOConfig(
        output_dir=trl_dir, use_cpu=True, bf16=precision.choose().bf16, per_device_train_batch_size=a.prompts * a.group,
        num_generations=a.group, max_completion_length=a.max_new, temperature=TEMPERATURE, top_p=1.0,
        learning_rate=LR, lr_scheduler_type="constant", adam_beta2=0.99, beta=0.0, loss_type="grpo",
        scale_rewards="group", gradient_checkpointing=False, max_steps=a.steps, logging_steps=1,
        save_strategy="no", report_to=[], seed=a.seed, disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                          processing_class=load_tokenizer("embedded"), callbacks=[Timer()])
    trainer.train()
    shutil.rmtree(trl_dir)
    for s in steps_log:
        s["tokens"] = s.get("mean_length", 0) * a.prompts * a.group
        s["update_s"] = s["step_s"] - s["gen_s"]  # reward time (microseconds here) included
    a.out.write_text(json.dumps({"steps": steps_log}))


def child_rlpost(a: argparse.Namespace) -> None:
    from rlpost import cli

    run_dir = Path(tempfile.mkdtemp()) / "run"
    code = cli.main([
        "train", f"rollout.prompts_per_step={a.prompts}", f"rollout.group_size={a.group}",
        f"rollout.max_new_tokens={a.max_new}", f"rollout.temperature={TEMPERATURE}", f"trainer.lr={LR}",
        f"run.steps={a.steps}", f"run.seed={a.seed}", "run.eval_every=0", "run.checkpoint_every=0",
        "task.n_heldout=16", "run.progress=false", f"run.out_dir={run_dir.parent}", "run.name=run",
        # trainer.micro_batch_size: the default, 32, one forward/backward for the batch, as TRL's
        # per_device_train_batch_size=32 runs it (runs before 2026-11-26 used 8: same gradient; on the
        # packed trunk with the heap kept, 32 measured 0.90x of 8 on the update, peak RSS 4.93 vs 4.78 GiB)
        *a.set,  # extra overrides (contention.py: run.threads=1)
    ])
    assert code == 0, f"rlpost train exited {code}"
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(run_dir.parent)  # RUN/model: 0.5 GB a child the table does not need
    steps_log = [{
        "step_s": m["timing_s/step"], "gen_s": m["timing_s/gen"], "update_s": m["timing_s/update"],
        "reward": m["reward/mean"], "mean_length": m["response_length/mean"],
        "tokens": m["response_length/mean"] * a.prompts * a.group,
        "logp_diff_mean": m["actor/logp_diff_sampler_mean"], "logp_diff_max": m["actor/logp_diff_sampler_max"],
        "threads": m.get("perf/threads"), "other_cores": m.get("perf/other_cores"),  # model/cores.py's count
    } for m in rows if "timing_s/update" in m]
    a.out.write_text(json.dumps({"steps": steps_log}))


def child_generate(a: argparse.Namespace) -> None:
    """Tokens/s on one 8 x 4 x 64 batch: rlpost's engine vs `generate` (the probe's dtype, dynamic /
    static cache); a.steps is the number of reps."""
    import copy

    import torch

    from rlpost import config
    from rlpost.envs import build_task
    from rlpost.model import precision
    from rlpost.model.load import load_policy
    from rlpost.roles.rollout_fast import FastRollout

    torch.set_num_threads(os.cpu_count())
    loaded = load_policy("embedded")
    rows = build_task(config.load(None, []).task).train[:PROMPTS]
    fast = FastRollout(copy.deepcopy(loaded.model), loaded.tokenizer)  # in the dtype the probe picks
    hf = copy.deepcopy(loaded.model).to(precision.sampler_dtype("auto")).eval()
    enc = loaded.tokenizer(fast.render(rows), return_tensors="pt", padding=True, add_special_tokens=False)

    def run_fast():
        return fast.generate(rows, GROUP, TEMPERATURE, 1.0, MAX_NEW).completion_mask.sum().item()

    engines = {"rlpost": run_fast,
               "generate_static": lambda: generate_tokens(hf, loaded.tokenizer, enc, fast, "static"),
               "generate_dynamic": lambda: generate_tokens(hf, loaded.tokenizer, enc, fast, None)}
    result = {k: [] for k in engines}
    seed, reps = a.seed, a.steps
    for r in range(reps + 1):  # rep 0 warms up (static cache allocation, oneDNN primitives)
        for name, fn in engines.items():
            torch.manual_seed(seed + r)
            t = time.perf_counter()
            tokens = fn()
            if r:
                result[name].append(tokens / (time.perf_counter() - t))
    a.out.write_text(json.dumps(result))


def generate_tokens(hf, tokenizer, enc, rollout, cache: str | None) -> int:
    """Completion tokens (up to EOS) of one plain `generate` call on the benchmark batch: bf16
    weights, full-softmax sampling (top_k=0), ``cache`` = 'static' or None (dynamic)."""
    import torch
    from transformers import GenerationConfig

    g = GenerationConfig(max_new_tokens=MAX_NEW, do_sample=True, temperature=TEMPERATURE, top_k=0, top_p=1.0,
                         num_return_sequences=GROUP, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, cache_implementation=cache)
    with torch.no_grad():
        ids = hf.generate(input_ids=enc.input_ids, attention_mask=enc.attention_mask, generation_config=g)
    return rollout.hf.completion_mask(ids[:, enc.input_ids.shape[1]:]).sum().item()


# ---------------------------------------------------------------------------------------------
# Parent: alternate, collect, report
# ---------------------------------------------------------------------------------------------


def spawn(kind: str, steps: int, seed: int, shape: tuple[int, int, int] = (PROMPTS, GROUP, MAX_NEW),
          env: dict | None = None, overrides: tuple[str, ...] = ()) -> dict:
    """One child run of `kind`; its results with peak RSS and wall time. ``env``: added to ours;
    ``overrides``: extra rlpost config overrides."""
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    cmd = [sys.executable, __file__, "--child", kind, "--steps", str(steps), "--seed", str(seed), "--out", str(out),
           "--prompts", str(shape[0]), "--group", str(shape[1]), "--max-new", str(shape[2]),
           *(x for o in overrides for x in ("--set", o))]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"{kind} child failed:\n{proc.stderr.read()[-3000:]}")
    result = json.loads(out.read_text())
    result.update(peak_rss_gb=usage.ru_maxrss / 2**20, wall_s=time.perf_counter() - t)
    print(f"  {kind}: {result['wall_s']:.0f} s, peak RSS {result['peak_rss_gb']:.2f} GiB", flush=True)
    return result


def summarise(runs: list[dict]) -> dict:
    # The first step of each run warms up (oneDNN primitives, allocator): medians skip it.
    steps = [s for r in runs for s in r["steps"][1:]]
    med = lambda k: statistics.median(s[k] for s in steps)
    out = {"step_s": med("step_s"), "gen_s": med("gen_s"), "update_s": med("update_s"),
           "gen_tok_s": statistics.median(s["tokens"] / s["gen_s"] for s in steps),
           "peak_rss_gb": max(r["peak_rss_gb"] for r in runs),
           "reward_by_step": [statistics.mean(r["steps"][i]["reward"] for r in runs)
                              for i in range(len(runs[0]["steps"]))]}
    if "logp_diff_mean" in steps[0]:
        out["logp_diff_mean"] = statistics.mean(s["logp_diff_mean"] for s in steps)
        out["logp_diff_max"] = max(s["logp_diff_max"] for s in steps)
    return out


def report(trl: dict, ours: dict, gen: dict, args) -> str:
    ratio = lambda k: ours[k] / trl[k]
    g = {k: statistics.median(v) for k, v in gen.items()}
    lines = [
        (f"{args.rounds} rounds x {args.steps} steps each, alternating; medians over steps 2..{args.steps} of "
         "every run."),
        "", "| | TRL GRPOTrainer | rlpost | rlpost / TRL |", "|---|---|---|---|",
        f"| median step time (s) | {trl['step_s']:.1f} | {ours['step_s']:.1f} | **{ratio('step_s'):.2f}** |",
        f"| median generation time (s) | {trl['gen_s']:.1f} | {ours['gen_s']:.1f} | {ratio('gen_s'):.2f} |",
        (f"| generation tok/s (completion tokens) | {trl['gen_tok_s']:.0f} | {ours['gen_tok_s']:.0f} | "
         f"{ratio('gen_tok_s'):.2f} |"),
        f"| median update time (s) | {trl['update_s']:.1f} | {ours['update_s']:.1f} | {ratio('update_s'):.2f} |",
        f"| peak RSS (GiB) | {trl['peak_rss_gb']:.2f} | {ours['peak_rss_gb']:.2f} | **{ratio('peak_rss_gb'):.2f}** |",
        f"| mean reward by step | {' '.join(f'{x:.2f}' for x in trl['reward_by_step'])} | "
        f"{' '.join(f'{x:.2f}' for x in ours['reward_by_step'])} | |",
        "", f"Sampler vs trainer log-probs (rlpost, same weights): mean |diff| {ours['logp_diff_mean']:.4f}, "
        f"max |diff| {ours['logp_diff_max']:.3f} nats per token.",
        "", f"Same 8 x 4 x 64 batch, {args.gen_reps} reps each, alternating (tokens up to EOS per second):", "",
        "| engine | tok/s | vs generate (static cache) |", "|---|---|---|",
    ]
    for k in ("generate_dynamic", "generate_static", "rlpost"):
        lines.append(f"| {k} | {g[k]:.0f} | {g[k] / g['generate_static']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--gen-reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=PROMPTS)
    ap.add_argument("--group", type=int, default=GROUP)
    ap.add_argument("--max-new", type=int, default=MAX_NEW)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="child rlpost: an extra override")
    ap.add_argument("--spincount", default=None,
                    help="both children under OMP_WAIT_POLICY=PASSIVE with this GOMP_SPINCOUNT (default: the "
                         "environment's wait, GNU OpenMP's own unless set); writes vs_trl-spinN")
    ap.add_argument("--child", choices=["trl", "rlpost", "generate"])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.child:
        {"trl": child_trl, "rlpost": child_rlpost, "generate": child_generate}[args.child](args)
        return
    ensure_trl()
    header, shape = machine.Header(), (args.prompts, args.group, args.max_new)
    wait = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": args.spincount} if args.spincount is not None else {}
    runs: dict[str, list] = {"trl": [], "rlpost": []}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        for kind in (["trl", "rlpost"] if r % 2 == 0 else ["rlpost", "trl"]):
            runs[kind].append(spawn(kind, args.steps, args.seed + r, shape, wait))
    gen = spawn("generate", args.gen_reps, args.seed, shape, wait)
    gen.pop("peak_rss_gb"), gen.pop("wall_s")
    trl, ours = summarise(runs["trl"]), summarise(runs["rlpost"])
    text = report(trl, ours, gen, args)
    print(text)
    name = "vs_trl" if args.spincount is None else f"vs_trl-spin{args.spincount}"
    machine.write_results(name, {"trl": trl, "rlpost": ours, "generate": gen, "runs": runs}, header, text)


if __name__ == "__main__":
    main()
