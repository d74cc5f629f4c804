"""How the demo's generation and update scale with torch's threads: 1 against 2, in one process.

    .venv/bin/python benchmarks/threads.py                        # 4 x 4 rows (multinode.py's run), 4 rounds
    .venv/bin/python benchmarks/threads.py --prompts 16 --group 8  # the demo's batch

The figures behind the planner's thread model (observe/devices.py: thread_speedup), which prices a Ray actor's
compute phases at the threads it really gets rather than the machine's cores. The embedded SmolLM2-135M-Instruct,
the demo task's prompts, the own engine's sampler in the dtype the probe picks and the trainer (GRPO's loss, the
config's defaults) in one process; each round runs generation and then the update once at 1 thread and once at 2,
the order flipped every round, so the ratio is taken under the load of that minute (a shared machine's load moves
by minutes). Reports each phase's median seconds at each count and the median of the rounds' 1-thread / 2-thread
ratios. Writes benchmarks/results/threads-<isa>.{json,md}.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import machine  # benchmarks/machine.py: where the figures came from
import torch


def roles(prompts: int, group: int, new_tokens: int):
    """(sampler, trainer, algorithm, prompt rows, config) of the demo's workload at this batch."""
    from rlpost import algorithms, build, config
    from rlpost.envs.arithmetic import build_splits
    from rlpost.model.load import load_policy_for

    cfg = build.resolve_precision(config.load(overrides=[
        f"rollout.prompts_per_step={prompts}", f"rollout.group_size={group}", f"rollout.max_new_tokens={new_tokens}"]))
    loaded = load_policy_for(cfg.model, cfg.run.seed)
    sampler = build.make_rollout(cfg, copy.deepcopy(loaded.model), loaded.tokenizer)
    trainer = build.make_trainer(cfg, loaded.model, False)
    algo = algorithms.build(cfg.algo, group, new_tokens)
    return sampler, trainer, algo, build_splits(cfg.task)[0], cfg


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def run(prompts: int, group: int, new_tokens: int, rounds: int) -> dict:
    sampler, trainer, algo, rows, cfg = roles(prompts, group, new_tokens)
    r = cfg.rollout
    times = {(phase, n): [] for phase in ("gen", "update") for n in (1, 2)}
    tokens = []

    def one(step: int, n: int) -> None:
        torch.set_num_threads(n)
        torch.manual_seed(step)
        chosen = rows[(step * prompts) % len(rows):][:prompts]
        batch, gen_s = timed(lambda: sampler.generate(chosen, group, r.temperature, r.top_p, new_tokens))
        batch.reward = torch.rand(prompts * group, generator=torch.Generator().manual_seed(step))
        batch.advantages = algo.advantages(batch).tokens
        _, update_s = timed(lambda: trainer.update(batch, algo.loss))
        times[("gen", n)].append(gen_s)
        times[("update", n)].append(update_s)
        tokens.append(int(batch.completion_mask.sum()))
        print(f"threads {n}: gen {gen_s:.2f} s, update {update_s:.2f} s ({tokens[-1]} tokens)", flush=True)

    one(0, 2)  # warm-up: first calls allocate, the probe and the kernels' first dispatch
    times = {k: [] for k in times}
    tokens.clear()
    for i in range(rounds):
        for n in ((1, 2) if i % 2 == 0 else (2, 1)):
            one(1 + 2 * i + (n - 1), n)
    out = {"prompts": prompts, "group": group, "new_tokens": new_tokens, "rounds": rounds,
           "sampler_dtype": r.dtype, "trainer_precision": cfg.trainer.precision, "tokens": tokens,
           "seconds": {f"{p}@{n}": v for (p, n), v in times.items()}}
    for phase in ("gen", "update"):
        one_t, two_t = times[(phase, 1)], times[(phase, 2)]
        out[phase] = {"median_1": statistics.median(one_t), "median_2": statistics.median(two_t),
                      "ratio_1_over_2": statistics.median(a / b for a, b in zip(one_t, two_t))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    header = machine.Header()
    result = run(a.prompts, a.group, a.new_tokens, a.rounds)
    lines = [f"{a.prompts} x {a.group} rows, {a.new_tokens} new tokens, sampler {result['sampler_dtype']}, trainer "
             f"{result['trainer_precision']}; {a.rounds} rounds, each phase at 1 and 2 threads in turn", "",
             "| phase | 1 thread, median s | 2 threads, median s | 1 / 2, median of the rounds' ratios |",
             "|---|---:|---:|---:|"]
    for phase in ("gen", "update"):
        x = result[phase]
        lines.append(f"| {phase} | {x['median_1']:.3f} | {x['median_2']:.3f} | {x['ratio_1_over_2']:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    machine.write_results(f"threads-{a.prompts}x{a.group}", result, header, text)


if __name__ == "__main__":
    main()
