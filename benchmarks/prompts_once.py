"""The update with each mini-batch's prompts run once (trainer.prompts_once=true, the default) against
each micro-batch running its own groups' prompts (false), on vs_trl.py's configuration.

    .venv/bin/python benchmarks/prompts_once.py           # 2 rounds x (on, off) x 6 steps, alternating, ~8 min

With the prompts run once, micro-batches take rows of similar length from any group, so fewer padded
completion positions run through the trunk (benchmarks/update_cost.py counts them: -30 to -36% on
this configuration); with them off, micro-batches keep groups whole. The gradient is the same
(tests/roles/test_trainer.py), so the reward curves should match within float rounding. Every run is
its own process (vs_trl.spawn); medians over steps 2..6 of every run, and the per-step update ratio
of runs that saw the same batches (same seed, same round).
Writes benchmarks/results/prompts_once-<isa>.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics

import machine  # benchmarks/machine.py: where the figures came from
import vs_trl

SETTINGS = {"on": ("trainer.prompts_once=true",), "off": ("trainer.prompts_once=false",)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    header, runs = machine.Header(), {"on": [], "off": []}
    for r in range(args.rounds):
        for name in (("on", "off") if r % 2 == 0 else ("off", "on")):
            print(f"round {r + 1}/{args.rounds}: prompts_once {name}", flush=True)
            runs[name].append(vs_trl.spawn("rlpost", args.steps, args.seed, overrides=SETTINGS[name]))
    med = {name: {k: statistics.median(s[k] for run in rs for s in run["steps"][1:])
                  for k in ("step_s", "gen_s", "update_s")}
           for name, rs in runs.items()}
    paired = [a["update_s"] / b["update_s"] for ra, rb in zip(runs["on"], runs["off"])
              for a, b in zip(ra["steps"][1:], rb["steps"][1:])]
    rss = {name: max(run["peak_rss_gb"] for run in rs) for name, rs in runs.items()}
    lines = [f"vs_trl.py's configuration (8 prompts x 4, <= 64 new tokens, micro-batch 8), {args.rounds} rounds x "
             f"{args.steps} steps, alternating; medians over steps 2..{args.steps} of every run.", "",
             "| trainer.prompts_once | step s | gen s | update s | peak RSS GiB |", "|---|---|---|---|---|"]
    for name in ("on", "off"):
        m = med[name]
        lines.append(f"| {name} | {m['step_s']:.2f} | {m['gen_s']:.2f} | {m['update_s']:.2f} | {rss[name]:.2f} |")
    lines += ["",
              f"Update on / off: {med['on']['update_s'] / med['off']['update_s']:.2f} (medians); per step, paired by "
              f"round and step: median {statistics.median(paired):.2f}, range {min(paired):.2f}-{max(paired):.2f}.",
              "Mean reward by step, on: "
              + "; ".join(" ".join(f"{s['reward']:.2f}" for s in run["steps"]) for run in runs["on"]),
              "Mean reward by step, off: "
              + "; ".join(" ".join(f"{s['reward']:.2f}" for s in run["steps"]) for run in runs["off"])]
    text = "\n".join(lines) + "\n"
    print(text)
    machine.write_results("prompts_once", {"runs": runs, "medians": med, "paired_update_ratio": paired,
                                           "peak_rss_gb": rss}, header, text)


if __name__ == "__main__":
    main()
