"""The compiled trainer update (trainer.compile=on) against the eager one, on the demo's shapes.

    .venv/bin/python benchmarks/compiled_update.py                  # ~10 min on 2 quiet cores
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 .venv/bin/python benchmarks/compiled_update.py

The embedded model (SmolLM2-135M), the demo's batch shape (16 prompts x 8 completions, prompts of
36-44 tokens, completions of 4-16 tokens drawn per row, a new draw each step so the token counts vary
as a run's do), GRPO's loss through the trainer (micro-batch 32, prompts once, the precision the probe
picks). Two trainers in one process, one eager and one compiled, over copies of the model, take
turns on each step's batch, so the ratio is taken under the same load (a shared machine's load moves
by minutes). Per mode: each update's seconds, the median of those that compiled nothing, the compile's
graphs and seconds (model/compiled.py: Step), and the most resident memory an update added (VmRSS
sampled every 5 ms during it, less VmRSS before it: inductor's kernels are invisible to
update_memory.py's dispatch-mode reading, so the process's own is read). What trainer.compile=auto
chooses (model/compiled.py: pays) rests on these figures. Inductor's cache is a fresh folder (a cached
run would not pay the compile). Writes benchmarks/results/compiled_update-<isa>.{json,md}.

    .venv/bin/python benchmarks/compiled_update.py --per-process --row demo --cache DIR
    .venv/bin/python benchmarks/compiled_update.py --per-process --row vs_trl --modes off,on,hf --cache DIR

Peak memory per mode (issue 54 item 4): one child process per mode (the two trainers of one process
share its glibc heap, which keeps what either freed, so the in-process reading does not separate
them). Each child builds its trainer, updates once on the row's batch (gradients and AdamW's state
allocated, every graph of that shape compiled), resets the kernel's peak-RSS mark (/proc/self/clear_refs)
and updates again on a copy of the same batch: the peak VmHWM of that update, less VmRSS just before
it (what the update adds) and less VmRSS before the first update (the brief's reading: the update's
peak over the process as it stood before any update; the gradients, AdamW's moments and, compiled,
inductor's kernels are in it). Rows: ``demo`` (above) and ``vs_trl``, update_memory.py's
Qwen2.5-0.5B-wide model (random init, 2 layers, 32 rows of 24 + 256 tokens, micro-batches of 8, bf16
autocast: the H100 0.5B row's update at a CPU's scale). Modes: off, on (trainer.compile) and hf
(eager, trainer.forward=hf: transformers' forward, TRL's layout). Writes
results/compiled_update_memory-<row>-<isa>.{json,md}.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys
import statistics
import tempfile
import threading
import time
from dataclasses import replace

import machine  # benchmarks/machine.py: where the figures came from
import torch

STEPS, PROMPTS, K = 5, 16, 8


def demo_batch(seed: int):
    """The demo's shape: PROMPTS groups of K rows, left-padded prompts, completions of 4..16 tokens."""
    from rlpost.types.batch import Rollouts

    g = torch.Generator().manual_seed(seed)
    P, T = 44, 16
    plen = torch.randint(36, P + 1, (PROMPTS,), generator=g).repeat_interleave(K)
    prompt_mask = torch.arange(P)[None, :] >= (P - plen)[:, None]
    prompts = torch.randint(3, 49152, (PROMPTS, P), generator=g).repeat_interleave(K, 0) * prompt_mask
    clen = torch.randint(4, T + 1, (PROMPTS * K,), generator=g)
    mask = torch.arange(T)[None, :] < clen[:, None]
    b = Rollouts(prompt_ids=prompts, prompt_mask=prompt_mask,
                 completion_ids=torch.randint(3, 49152, (PROMPTS * K, T), generator=g) * mask, completion_mask=mask,
                 sampler_logp=torch.zeros(PROMPTS * K, T), truncated=torch.zeros(PROMPTS * K, dtype=torch.bool),
                 group_ids=torch.arange(PROMPTS).repeat_interleave(K), rows=[{}] * (PROMPTS * K),
                 completions=[""] * (PROMPTS * K))
    b.advantages = torch.randn(PROMPTS * K, T, generator=g) * mask
    return b


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """The most resident memory above what there was at the start, sampled every 5 ms while open."""

    def __enter__(self):
        self.base = self.peak = rss_bytes()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self):
        while not self.done.wait(0.005):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, rss_bytes())
        self.added = self.peak - self.base


def run(steps: int) -> dict:
    from rlpost import build
    from rlpost.algorithms.grpo import GRPO
    from rlpost.model import precision
    from rlpost.model.load import load_policy
    from rlpost.sections import TrainerConfig

    torch.set_num_threads(2)
    model = load_policy("embedded").model
    prec = "bf16" if precision.trainer_bf16("auto") else "fp32"
    trainers = {mode: build.trainer_over(copy.deepcopy(model), replace(TrainerConfig(), compile=mode, precision=prec),
                                         0.7, PROMPTS * K, 32, steps) for mode in ("off", "on")}
    del model
    loss = GRPO(group_size=K).loss
    out = {mode: {"update_s": [], "graphs_compiled": [], "added_gib": []} for mode in trainers}
    for step in range(steps):
        for mode, tr in trainers.items():
            before = len(tr.step.graphs) if tr.step else 0
            batch = demo_batch(step)
            with PeakRss() as rss:
                t0 = time.perf_counter()
                tr.update(batch, loss)
                out[mode]["update_s"].append(time.perf_counter() - t0)
            out[mode]["added_gib"].append(rss.added / 2**30)
            out[mode]["graphs_compiled"].append((len(tr.step.graphs) if tr.step else 0) - before)
            print(mode, step, out[mode]["update_s"][-1], out[mode]["graphs_compiled"][-1], flush=True)
    for mode, tr in trainers.items():
        r = out[mode]
        steady = [t for t, c in zip(r["update_s"], r["graphs_compiled"]) if c == 0] or r["update_s"][1:]
        r.update(mode=mode, precision=prec, steady_median_s=statistics.median(steady),
                 compile_s=tr.step.compile_s if tr.step else 0.0, graphs=len(tr.step.graphs) if tr.step else 0,
                 peak_added_gib=max(r["added_gib"][1:] or r["added_gib"]))
    return out


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


def row_trainer(row: str, mode: str):
    """(trainer, loss, batch) of ``row`` with trainer.compile=``mode`` (hf: eager, transformers' forward)."""
    from rlpost import algorithms, build, config

    if row == "demo":
        from rlpost.algorithms.grpo import GRPO
        from rlpost.model import precision
        from rlpost.model.load import load_policy
        from rlpost.sections import TrainerConfig

        tcfg = TrainerConfig(compile="off" if mode == "hf" else mode,
                             precision="bf16" if precision.trainer_bf16("auto") else "fp32",
                             forward="hf" if mode == "hf" else TrainerConfig().forward)
        trainer = build.trainer_over(load_policy("embedded").model, tcfg, 0.7, PROMPTS * K, 32, 2)
        return trainer, GRPO(group_size=K).loss, demo_batch(0)
    import update_memory as um  # benchmarks/update_memory.py: the 0.5B-wide model and its batch shape
    from kernel_count import batch

    cfg = config.load(None, [f"trainer.forward={'hf' if mode == 'hf' else 'packed'}", "trainer.precision=bf16",
                             f"trainer.compile={'off' if mode == 'hf' else mode}",
                             f"trainer.micro_batch_size={um.MICRO}", f"rollout.prompts_per_step={um.ROWS // um.GROUP}",
                             f"rollout.group_size={um.GROUP}"])
    trainer = build.make_trainer(cfg, um.model(um.LAYERS[-1]).train(), False)
    loss = algorithms.build(cfg.algo, cfg.rollout.group_size, cfg.rollout.max_new_tokens).loss
    return trainer, loss, batch(um.ROWS, um.PROMPT, um.COMPLETION, um.ROWS // um.GROUP)


def child(row: str, mode: str) -> None:
    """One mode's peak memory, in this process alone; one JSON line on stdout."""
    torch.set_num_threads(2)
    trainer, loss, b = row_trainer(row, mode)
    start = status_kib("VmRSS")
    t0 = time.perf_counter()
    trainer.update(copy.deepcopy(b), loss)
    first = time.perf_counter() - t0
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = status_kib("VmRSS")
    t0 = time.perf_counter()
    trainer.update(copy.deepcopy(b), loss)
    second = time.perf_counter() - t0
    hwm = status_kib("VmHWM")
    kib = 2**20
    print(json.dumps({"row": row, "mode": mode, "first_s": first, "update_s": second,
                      "graphs": len(trainer.step.graphs) if trainer.step else 0,
                      "rss_before_first_gib": start / kib, "rss_before_gib": before / kib, "hwm_gib": hwm / kib,
                      "update_adds_gib": (hwm - before) / kib, "over_start_gib": (hwm - start) / kib}))


def per_process(row: str, modes: list[str], cache: str) -> None:
    header = machine.Header()
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
    out = {}
    for mode in modes:
        done = subprocess.run([sys.executable, __file__, "--child", f"{row}:{mode}"], env=env, stdout=subprocess.PIPE,
                              text=True, check=True)
        out[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        print(out[mode], flush=True)
    lines = [f"Peak memory of the trainer update, one process per mode, the {row} row (--per-process; inductor's cache "
             f"{cache}). VmHWM reset before the second update on the same batch (the first allocated the gradients "
             "and AdamW's state and compiled the shape's graphs).", "",
             "| mode | update (s) | graphs | RSS before the 1st update (GiB) | peak of the 2nd (GiB) | "
             "it adds over the RSS before it (GiB) | over the RSS before the 1st (GiB) |",
             "|---|---|---|---|---|---|---|"]
    for r in out.values():
        lines.append(f"| {r['mode']} | {r['update_s']:.1f} | {r['graphs']} | {r['rss_before_first_gib']:.2f} | "
                     f"{r['hwm_gib']:.2f} | {r['update_adds_gib']:.2f} | {r['over_start_gib']:.2f} |")
    if "on" in out and "off" in out:
        lines += ["", "compiled / eager: the update adds "
                  f"{out['on']['update_adds_gib'] / out['off']['update_adds_gib']:.2f}x, over the start "
                  f"{out['on']['over_start_gib'] / out['off']['over_start_gib']:.2f}x"]
    text = "\n".join(lines) + "\n"
    print(text)
    machine.write_results(f"compiled_update_memory-{row}", out, header, text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--cache", help="inductor's cache folder to use (default: a fresh one, so the compile is paid)")
    ap.add_argument("--per-process", action="store_true", help="peak memory, one child process per mode")
    ap.add_argument("--row", choices=("demo", "vs_trl"), default="demo", help="with --per-process: the batch")
    ap.add_argument("--modes", default="off,on", help="with --per-process: of off, on, hf")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # ROW:MODE, a --per-process child
    args = ap.parse_args()
    if args.child:
        return child(*args.child.split(":"))
    if args.per_process:
        if not args.cache:
            ap.error("--per-process needs --cache DIR (each child would compile into a folder of its own)")
        return per_process(args.row, args.modes.split(","), args.cache)
    header = machine.Header()
    with tempfile.TemporaryDirectory() as fresh:
        # before rlpost's import reads it (model/compiled.py)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = args.cache or fresh
        result = run(args.steps)
    off, on = result["off"], result["on"]
    total_off, total_on = sum(off["update_s"]), sum(on["update_s"])
    lines = [f"The trainer update compiled (trainer.compile=on) vs eager, {args.steps} updates of the demo's shape "
             f"({PROMPTS} x {K} rows, the embedded model, {off['precision']}), the two trainers taking turns in one "
             f"process, inductor's cache {'given (--cache)' if args.cache else 'empty'}.", "",
             "| mode | update, steady (s) | updates (s) | graphs | compile (s) | RSS an update adds, peak (GiB) |",
             "|---|---|---|---|---|---|"]
    for r in (off, on):
        lines.append(f"| {r['mode']} | {r['steady_median_s']:.2f} | {' '.join(f'{t:.1f}' for t in r['update_s'])} | "
                     f"{r['graphs']} | {r['compile_s']:.0f} | {r['peak_added_gib']:.2f} |")
    ratio = on["steady_median_s"] / off["steady_median_s"]
    gain = off["steady_median_s"] - on["steady_median_s"]
    lines += ["", f"compiled / eager, steady update: {ratio:.2f}x; {args.steps} updates in all, compile included: "
              f"{total_on:.0f} s vs {total_off:.0f} s; "
              + (f"the compile is earned back after {on['compile_s'] / gain:.0f} updates" if gain > 0
                 else "the compile is never earned back")]
    text = "\n".join(lines) + "\n"
    print(text)
    machine.write_results("compiled_update", result, header, text)


if __name__ == "__main__":
    main()
