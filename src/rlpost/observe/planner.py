"""Planner (``rlpost plan``): memory and step time of one RL training step, before running it.

Back-of-envelope formulas (docs/planner.md), each phase at an efficiency that ``calibrate`` checks
against a real run. Split by role: what is planned for (observe/workload.py: Shape, Workload), the
hardware (observe/devices.py: Device, efficiencies, GPU latencies), what a step costs there
(observe/cost.py), what a run folder or the command line asks for (observe/plan_inputs.py), and here
the plan, the calibration against a run folder and the command line's output.
Pure functions over three frozen records; only ``run``/``main`` print. Bad input raises
``ConfigError`` naming the argument (the CLI exits 2).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

import yaml

from rlpost.config import Config, ConfigError, from_dict, to_dict
from rlpost.console import Parser
from rlpost.observe.cost import (  # noqa: F401 - re-exported: planner.memory etc.
    GiB, activation_bytes, attn_flops, decode_latency, forward_flops, gpu_step, kv_cache_bytes, logits_bytes, memory,
    prompt_runs, prompts_once, rollout_parts, rollout_time, step_time, update_flops, update_latency)
from rlpost.observe.devices import (  # noqa: F401 - re-exported: planner.GPUS etc.
    CPU_AVX512, EFFICIENCY, GPU_LATENCY, GPUS, PARALLEL, Device, at_threads, bf16_on, decode_overhead, efficiency,
    probed_cpu, resolve_device, thread_factor)
from rlpost.observe.timeline import (  # noqa: F401 - re-exported: planner.Net etc.
    NET_GBPS, LOAD_GBS, Net, across_nodes, gantt, link_terms, load_terms, sync_bytes, timeline)
from rlpost.observe.workload import (  # noqa: F401 - re-exported: planner.Shape etc.
    EMBEDDED, EMBEDDED_NAMES, HUB_SHAPES, TINY, Shape, Workload, find_model, parse_size, resolve_model,
    shape_from_config_json, shape_from_size)
from rlpost.observe.plan_inputs import (  # noqa: F401 - re-exported: planner.workload_from_args etc.
    EFF_MAX, INT_ARGS, actor_threads, add_arguments, algorithm_parts, engine_of, net_from_args, parse_eff,
    path_from_args, streams, workload_from_args, workload_from_run)


# What a GPU plan rests on that no GPU run has measured ("fits" is the memory check alone).
GPU_CAVEATS = ("fitted on H100 runs of models up to 0.5B (the demo and a Qwen2.5-0.5B shape, each phase within "
               "0.87-1.09x, docs/planner.md; the trainer's kernel count since then is counted, not measured); a "
               "larger model's kernels are priced at those runs' efficiencies, and other GPUs by their spec sheets",)
MULTI_GPU = "data parallelism over GPUs (FSDP2 on NCCL) has run on the CPU only, on gloo (docs/distributed.md)"
GPU_LOAD = (f"the rollout workers' weight load beyond the link ({LOAD_GBS:g} GB/s of pushed bytes) was measured on a "
            "CPU only")


# --- The plan ---
LABELS = {"weights": "policy weights (fp32 master)", "sampler": "sampler copy", "grads": "gradients (fp32)",
          "adamw": "AdamW states (2 x fp32)", "reference": "reference copy (fp32)",
          "critic": "critic (weights+grads+AdamW)", "activations": "activations (1 micro-batch fwd+bwd)",
          "logits": "logits (B, T, V) for log-softmax", "step": "step", "kv_cache": "sampler KV cache",
          "runtime": "runtime overhead", "total": "total (peak)", "sync": "weight sync",
          "gen": "rollout (prefill + decode)", "ref": "reference forward", "old": "old log-probs (+values)",
          "update": "update (fwd+bwd+AdamW)", "sync_link": "weight sync over the network",
          "fsdp_link": "FSDP traffic over the network", "load": "weight load on the rollout workers"}


def plan(s: Shape, w: Workload, dev: Device = CPU_AVX512, gpus: int = 1, eff: dict | None = None,
         net: Net | None = None) -> dict:
    mem, net = memory(s, w, dev, gpus), net or Net()
    fits = mem["total"] <= dev.memory_gib * GiB if dev.memory_gib else None
    t = at_threads(step_time(s, w, dev, gpus, eff), dev, net.trainer_threads, net.rollout_threads)
    t = across_nodes(s, w, t, gpus, net)
    out = {"params": s.params, "shape": asdict(s), "workload": asdict(w), "device": dev.name,
           "gpus": gpus, "memory_bytes": mem, "time_s": t, "fits": fits, "nodes": net.nodes, "net_gbps": net.gbps,
           "topology": net.topology, "weight_sync": net.weight_sync,
           "timeline": timeline({k: v for k, v in t.items() if k != "step"}, net.topology, net.weight_sync),
           "caveats": [] if dev.cpu else [*GPU_CAVEATS, *([MULTI_GPU] if gpus > 1 else []),
                                          *([GPU_LOAD] if "load" in t else [])]}
    if fits is False:
        out["would_fit"] = would_fit(s, w, dev, gpus, eff)
    return out


# --- What would fit, where a plan does not ---
FIT_GPUS = (2, 4, 8)  # FSDP over the GPUs of one node
FIT_SHOWN = 3


def fit_knobs(w: Workload, dev: Device, gpus: int) -> list[tuple[int, bool, bool, int]]:
    """Every (GPUs, bf16, checkpointing, rows per micro-batch) to try: the user's own knobs, each only where it
    changes something. More GPUs not with a critic (dist.trainer_ranks > 1 refuses one), nor on a CPU."""
    counts = [gpus] + ([g for g in FIT_GPUS if g > gpus] if not dev.cpu and not w.critic else [])
    bf16 = [False] + ([True] if bf16_on("auto", dev) and not (w.trainer_bf16 and w.sampler_bf16) else [])
    ckpt = [False] + ([] if w.grad_ckpt else [True])
    rows = [w.micro() >> i for i in range(w.micro().bit_length())]  # the plan's own, halved down to 1
    return [(g, b, c, r) for g in counts for b in bf16 for c in ckpt for r in rows]


def with_knobs(w: Workload, gpus: int, knobs: tuple[int, bool, bool, int]) -> tuple[Workload, list[str], list[str]]:
    """(the workload with ``knobs`` (``fit_knobs``), the flags that say so, the config keys that say so)."""
    g, bf16, ckpt, rows = knobs
    flags, keys, new = [], [], replace(w, grad_ckpt=w.grad_ckpt or ckpt)
    if bf16 and not w.trainer_bf16:
        flags, keys = [*flags, "--precision", "bf16"], [*keys, "trainer.precision=bf16"]
    if bf16 and not w.sampler_bf16:
        flags, keys = [*flags, "--sampler-dtype", "bf16"], [*keys, "rollout.dtype=bfloat16"]
    if bf16:
        new = replace(new, trainer_bf16=True, sampler_bf16=True)
    if ckpt:
        flags, keys = [*flags, "--grad-ckpt"], [*keys, "model.gradient_checkpointing=true"]
    if rows != w.micro() and w.micro_tokens:  # micro-batches by tokens: as many tokens as `rows` padded rows
        tokens = rows * (w.prompt_len + w.T)
        new = replace(new, micro_tokens=tokens)
        flags, keys = [*flags, "--micro-batch-tokens", str(tokens)], [*keys, f"trainer.micro_batch_tokens={tokens}"]
    elif rows != w.micro():
        new = replace(new, micro_batch=rows)
        flags, keys = [*flags, "--micro-batch", str(rows)], [*keys, f"trainer.micro_batch_size={rows}"]
    if g != gpus:  # the plan's G GPUs each hold a trainer shard; rlpost's rollout workers take GPUs of their own
        flags, keys = [*flags, "--gpus", str(g)], [*keys, "dist.topology=disaggregated", f"dist.trainer_ranks={g}"]
    return new, flags, keys


def would_fit(s: Shape, w: Workload, dev: Device, gpus: int = 1, eff: dict | None = None) -> dict:
    """What fits a plan that does not, by the same memory model: the first FIT_SHOWN combinations of the user's
    knobs that fit and that no other fitting one beats on every knob (fewer GPUs, no bf16 change, no checkpointing,
    more rows per micro-batch), in that order; and, when none fits, the most relieved one and its largest term."""
    limit, tried = dev.memory_gib * GiB, fit_knobs(w, dev, gpus)
    mems = {k: memory(s, with_knobs(w, gpus, k)[0], dev, k[0]) for k in tried}
    fitting = [k for k in tried if mems[k]["total"] <= limit]
    def beats(a, b):
        return a != b and a[0] <= b[0] and a[1] <= b[1] and a[2] <= b[2] and a[3] >= b[3]
    best = [k for k in fitting if not any(beats(o, k) for o in fitting)]
    best.sort(key=lambda k: (k[0], k[1], k[2], -k[3]))
    options = []
    for k in best[:FIT_SHOWN]:
        new, flags, keys = with_knobs(w, gpus, k)
        options.append({"gpus": k[0], "flags": flags, "keys": keys, "total_gib": mems[k]["total"] / GiB,
                        "step_s": step_time(s, new, dev, k[0], eff)["step"]})
    last = mems[tried[-1]]  # the most relieved: the most GPUs, bf16, checkpointing, one row a micro-batch
    part = max((k for k in last if k != "total"), key=last.get)
    closest = None if options else {"gpus": tried[-1][0], "flags": with_knobs(w, gpus, tried[-1])[1],
                                    "total_gib": last["total"] / GiB, "largest": part, "largest_gib": last[part] / GiB,
                                    "note": "a critic: dist.trainer_ranks > 1 refuses one" if w.critic else ""}
    return {"options": options, "closest": closest}


# --- Calibration against a finished run ---

def read_run(run_dir: str | Path) -> tuple[Config, dict, int, dict]:
    """(validated config, median of each metric over steps, steps, summary) of a run folder."""
    d = Path(run_dir)
    if not (d / "config.yaml").is_file():
        raise ConfigError(f"--from: no config.yaml in {d}; is it a run folder?")
    try:
        tree = yaml.safe_load((d / "config.yaml").read_text()) or {}
        lines = [json.loads(text) for text in (d / "metrics.jsonl").read_text().splitlines() if text.strip()]
        summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").exists() else {}
        # Keys a newer or older rlpost does not know are dropped; missing ones take today's defaults.
        known = to_dict(Config())
        cfg = from_dict({sec: {k: v for k, v in (tree.get(sec) or {}).items() if k in known[sec]} for sec in known})
    except (OSError, ValueError, AttributeError, yaml.YAMLError) as e:  # ConfigError is a ValueError
        raise ConfigError(f"--from: cannot read {d}: {str(e).splitlines()[0]}") from None
    if not lines:
        raise ConfigError(f"--from: {d}/metrics.jsonl has no steps")
    keys = {k for line in lines for k, v in line.items() if isinstance(v, (int, float))}
    if isinstance(summary, dict) and summary.get("kind"):  # rlpost sft, dpo, rm, rsft write theirs; an RL run none
        raise ConfigError(f"--from: {d} is an rlpost {summary['kind']} run (summary.json: kind), not an RL run; the "
                          "planner prices an RL step (the GRPO family, PPO)")
    med = {k: statistics.median(line[k] for line in lines if isinstance(line.get(k), (int, float))) for k in keys}
    return cfg, med, len(lines), summary


def calibrate(run_dir: str | Path, device: str = "cpu", gpus: int = 1, eff: dict | None = None,
              path: dict | None = None, net: Net | None = None) -> dict:
    """Predict a finished run's step against its medians over steps. Rows: name, unit, predicted, measured (None if
    not logged), ratio = measured / predicted (divide that phase's efficiency by it, via --eff, to match the run).
    ``path``: Workload fields of the code path the run took where its config does not say (``path_from_args``)."""
    cfg, med, steps, summary = read_run(run_dir)
    shape, w, dev, net = run_inputs(cfg, med, device, path, net)
    p = plan(shape, w, dev, gpus, eff, net)
    rows = [(f"timing_s/{k}", "s", v, med.get(f"timing_s/{k}")) for k, v in p["time_s"].items()]
    if "load" in p["time_s"]:  # a worker times its load; under broadcast from the trainer's cast, across the link
        t = p["time_s"]
        sent = t["sync"] + t.get("sync_link", 0.0) if net.weight_sync == "broadcast" else 0.0
        rows.append(("timing_s/worker_weight_load", "s", sent + t["load"], med.get("timing_s/worker_weight_load")))
    # peak_rss_gb is ru_maxrss KiB / 2**20, so GiB; it includes everything the process held. On a
    # GPU the device's own peak: the caching allocator's (perf/max_memory_allocated_gb, GiB too).
    peak = summary.get("peak_rss_gb") if dev.cpu else summary.get("perf/max_memory_allocated_gb")
    rows.append(("peak memory", "GiB", p["memory_bytes"]["total"] / GiB, peak))
    out = [{"name": n, "unit": u, "predicted": pr, "measured": m, "ratio": m / pr if m is not None and pr else None}
           for n, u, pr, m in rows]
    return {"run_dir": str(run_dir), "model": cfg.model.name, "steps": steps, "rows": out, "plan": p}


def run_inputs(cfg: Config, med: dict, device: str, path: dict | None, net: Net | None) -> tuple:
    """(shape, workload, device, net) that ``plan`` prices a run folder's own workload with."""
    shape = resolve_model(cfg.model.name, "model.name (in the run's config.yaml)")
    dev = resolve_device(device, "--device")
    # the run's own topology, weight sync and threads: how it ran is not a question to ask the command line
    trainer, rollout = actor_threads(cfg.dist, cfg.run.threads, dev.cores)
    net = replace(net or Net(), topology=cfg.dist.topology, weight_sync=cfg.dist.weight_sync,
                  trainer_threads=trainer, rollout_threads=rollout)
    return shape, replace(workload_from_run(cfg, med, dev), **(path or {})), dev, net


# --- Efficiencies fitted to a run: carried to a plan of another layout (more nodes, another link) ---
# Each compute phase and the efficiencies that price it; a phase's are scaled by one factor. Not fitted: the weight
# sync, the link and the workers' load, bytes over a bandwidth whose own rows a run checks (worker_weight_load).
FIT_PHASES = {"gen": ("prefill", "decode", "decode_bw"), "update": ("update",), "ref+old": ("forward",)}


def measured_phases(run_dir: str | Path) -> dict[str, float]:
    """Each FIT_PHASES phase's seconds in a run folder: the median over its steps after the first (the first carries
    the warm-up), or its only step. A rollout worker's generation, as the driver times it, waits first for the new
    weights: its timing_s/worker_weight_load is taken off (a step without one loaded none)."""
    lines = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps, out = lines[1:] or lines, {}
    for phase in FIT_PHASES:
        keys = [f"timing_s/{k}" for k in phase.split("+")]
        values = [sum(m.get(k, 0.0) for k in keys) - (m.get("timing_s/worker_weight_load", 0.0) if phase == "gen"
                                                      else 0.0) for m in steps if any(k in m for k in keys)]
        if values:
            out[phase] = statistics.median(values)
    return out


def fit(run_dir: str | Path, device: str, gpus: int = 1, path: dict | None = None) -> dict:
    """The efficiencies that make the plan of a run folder's own workload match its phases (``measured_phases``):
    each phase's efficiencies, the table's at the run's precision, times the one factor k (bisected: a phase's
    seconds fall as k grows) at which the plan's seconds for it equal the measured. {'eff': {name: value}, 'phases':
    {phase: {measured, predicted (at the table's), k, capped}}}; a factor that would take an efficiency over
    EFF_MAX stops there (capped: the run is faster than the formula at EFF_MAX)."""
    cfg, med, _, _ = read_run(run_dir)
    shape, w, dev, net = run_inputs(cfg, med, device, path, None)
    table_eff = {"forward": w.trainer_bf16, "update": w.trainer_bf16, "prefill": w.sampler_bf16,
                 "decode": w.sampler_bf16, "decode_bw": w.sampler_bf16}
    table_eff = {k: efficiency(dev, k, bf16) for k, bf16 in table_eff.items()}
    eff, phases = {}, {}
    for phase, measured in measured_phases(run_dir).items():
        names, parts = FIT_PHASES[phase], phase.split("+")
        def seconds(k):
            t = plan(shape, w, dev, gpus, {n: table_eff[n] * k for n in names}, net)["time_s"]
            return sum(t.get(x, 0.0) for x in parts)
        predicted = seconds(1.0)
        if not predicted or measured <= 0:
            continue  # a phase this workload does not have, or a run that did not time it
        k_max = EFF_MAX / max(table_eff[n] for n in names)
        lo, hi = 1e-4, k_max
        for _ in range(60):  # geometric bisection: k to within 1e-9 of itself
            mid = math.sqrt(lo * hi)
            lo, hi = (lo, mid) if seconds(mid) < measured else (mid, hi)
        k = math.sqrt(lo * hi)
        eff |= {n: table_eff[n] * k for n in names}
        phases[phase] = {"measured": measured, "predicted": predicted, "k": k,
                         "capped": not 1.001e-4 < k < 0.999 * k_max}
    return {"run_dir": str(run_dir), "eff": eff, "phases": phases}


def eff_args(eff: dict[str, float]) -> str:
    """``fit``'s efficiencies as the --eff arguments of another plan (decimals parse_eff reads back)."""
    digits = {k: max(1, 2 - math.floor(math.log10(v))) for k, v in eff.items()}  # 3 significant, no exponent
    return " ".join(f"--eff {k}={f'{v:.{digits[k]}f}'.rstrip('0').rstrip('.')}" for k, v in eff.items())


def format_plan(p: dict, label: str) -> str:
    w, m, t = p["workload"], p["memory_bytes"], p["time_s"]
    lines = [f"rlpost plan: {label} ({p['params'] / 1e6:.1f}M params) on {p['gpus']} x {p['device']}; "
             f"{w['prompts']} prompts x {w['group']} = {w['prompts'] * w['group']} sequences, "
             f"prompt {w['prompt_len']} + {w['new_tokens']} new tokens"
             + (f"; {p['nodes']} nodes, {p['net_gbps']:g} Gbit/s between them" if p.get("nodes", 1) > 1 else "")
             + (f"; {p['topology']}" if p.get("topology", "colocated") != "colocated" else ""),
             "", f"{'memory per device':<44}{'GiB':>9}"]
    lines += [f"  {LABELS[k]:<42}{v / GiB:>9.3f}" for k, v in m.items()]
    if p["fits"] is not None:
        lines.append(f"  {'within device memory' + (' (estimate only)' if p['caveats'] else ''):<42}"
                     f"{'yes' if p['fits'] else 'NO':>9}")
    lines += ["", f"{'time per step':<44}{'s':>9}"] + [f"  {LABELS[k]:<42}{v:>9.3f}" for k, v in t.items()]
    how = {"async": "side by side, the step is the longer lane"}.get(p.get("topology"), "in turn, the step is the sum")
    lines += ["", f"timeline of a step ({p.get('topology', 'colocated')}: {how}; '.' = waiting)",
              *gantt(p["timeline"], LABELS)]
    lines += format_would_fit(p["would_fit"], p["device"]) if "would_fit" in p else []
    lines += (["", "what this GPU plan rests on; read it as an estimate:", *(f"  - {x}" for x in p["caveats"])]
              if p["caveats"] else [])
    return "\n".join(lines)


def format_would_fit(fit: dict, device: str) -> list[str]:
    """The lines under a plan that does not fit: each option's flags, then the config keys of the same meaning."""
    if not fit["options"]:
        c = fit["closest"]
        note = f" ({c['note']})" if c["note"] else ""
        return ["", f"nothing fits up to {c['gpus']} x {device}{note}: even with {' '.join(c['flags'])} a step needs "
                    f"{c['total_gib']:.1f} GiB per device; its largest part is the {LABELS[c['largest']]}, "
                    f"{c['largest_gib']:.1f} GiB"]
    lines = ["", "what would fit (the same memory model; the flags for this command, then the keys for the run):"]
    for i, o in enumerate(fit["options"], 1):
        lines += [f"  {i}. {' '.join(o['flags'])}: {o['total_gib']:.1f} GiB per device, step {o['step_s']:.3g} s",
                  f"     {' '.join(o['keys'])}"]
    if any(o["gpus"] > 1 for o in fit["options"]):
        lines.append("  (--gpus N: each GPU holds a trainer shard and a sampler; rlpost's rollout workers, "
                     "dist.rollout_workers, take GPUs of their own: docs/gpu.md)")
    return lines


def format_calibration(c: dict) -> str:
    def fmt(x):
        return f"{x:>10.3f}" if x is not None else f"{'-':>10}"
    lines = [f"rlpost plan --from {c['run_dir']}: {c['model']}, {c['steps']} steps (medians over steps)", "",
             f"{'':<22}{'unit':>5}{'predicted':>10}{'measured':>10}{'meas/pred':>10}"]
    lines += [f"{r['name']:<22}{r['unit']:>5}{fmt(r['predicted'])}{fmt(r['measured'])}{fmt(r['ratio'])}"
              for r in c["rows"]]
    return "\n".join(lines)


def format_fit(f: dict) -> str:
    lines = [f"rlpost plan --from {f['run_dir']} --fit: each phase's efficiencies x k, measured / predicted at the "
             "table's"]
    lines += [f"  {phase:<8} measured {r['measured']:.3f} s, predicted {r['predicted']:.3f} s: k = {r['k']:.3g}"
              + (f" (at a bound: an efficiency would leave (0, {EFF_MAX:g}])" if r["capped"] else "")
              for phase, r in f["phases"].items()]
    return "\n".join(lines)


# What --from takes from the run's own config.yaml, so a flag for it would be ignored: refused instead. (--from uses
# --device/--gpu, --gpus, --nodes, --net-gbps, --eff, --fit and the code path: --engine, --forward, --logp-chunk.)
FROM_RUN = ("model", "params", *(name for name, *_ in INT_ARGS), "mean_len", "min_len",
            "algo", "critic", "kl_coef", "precision", "sampler_dtype", "no_share_prefix", "grad_ckpt", "topology",
            "partial_rollouts", "weight_sync")


def run(args: argparse.Namespace, defaults: argparse.Namespace | None = None) -> int:
    """Print a plan (or a calibration with --from). Raises ConfigError on bad input. ``defaults``: the parser's
    values for no arguments, to tell a workload flag given with --from (which reads the run's own) from its default."""
    if args.run_dir and defaults is not None:
        given = [name for name in FROM_RUN if getattr(args, name) != getattr(defaults, name)]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise ConfigError(f"{flag}: rlpost plan --from prices the run's own workload (its config.yaml), so it "
                              f"would ignore {flag}; drop it, or plan without --from")
    dev = resolve_device(args.gpu, "--gpu") if args.gpu else resolve_device(args.device, "--device")
    if args.gpus < 1 or (dev.cpu and args.gpus != 1):
        raise ConfigError(f"--gpus: expected an integer >= 1 (exactly 1 on cpu), got {args.gpus}")
    eff, net = parse_eff(args.eff), net_from_args(args, dev)
    if args.fit and not args.run_dir:
        raise ConfigError("--fit: give the run to fit with --from RUN_DIR")
    if args.fit:
        out = fit(args.run_dir, args.gpu or args.device, args.gpus, path_from_args(args))
        print(format_fit(out), file=sys.stderr)
        text = eff_args(out["eff"])
    elif args.run_dir:
        out = calibrate(args.run_dir, args.gpu or args.device, args.gpus, eff, path_from_args(args), net)
        text = format_calibration(out)
    else:
        if args.model and args.params:
            raise ConfigError("--params: give either --model or --params, not both")
        shape, source = (shape_from_size(parse_size(args.params)), "") if args.params else find_model(
            args.model or "embedded")
        label = f"LLaMA-like ~{args.params}" if args.params else args.model or "embedded"
        label += f", shape from {source}" if source else ""
        out = plan(shape, workload_from_args(args, dev), dev, args.gpus, eff, net)
        out["model_source"] = source or None
        text = format_plan(out, label)
    print(json.dumps(out, indent=2) if args.json else text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = Parser(
        prog="rlpost plan", description="Estimate memory and step time of an RL step.",
        epilog="A GPU question (--gpu, or --gpus N > 1: an H100) plans prompt 128 + 256 new tokens, each unless "
        "given, where the defaults above are the CPU demo's. A plan over the device's memory lists what would fit "
        "(checkpointing, micro-batch, GPUs, bf16), as flags and config keys. docs/planner.md")
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv), parser.parse_args([]))
    except ConfigError as e:
        print(f"rlpost: error: {e}", file=sys.stderr)
        return 2
