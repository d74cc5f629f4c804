"""What one trainer update of the speed benchmark's configuration is made of: the profile behind
the roofline's update row (roofline.py), by kind of work.

    .venv/bin/python benchmarks/update_cost.py        # vs_trl.py's shape: 8 prompts x 4, <= 64 new tokens, 6 steps;
                                                      # ~4.5 min on AVX2
    .venv/bin/python benchmarks/update_cost.py --set trainer.forward=hf --set trainer.micro_batch_size=8
                                                      # the runs before 2026-11-26

Runs ``rlpost train`` in this process with vs_trl.py's rlpost configuration (the embedded model,
the demo task, micro-batch 32, the precision the probe picks) for ``--steps`` steps. The last step's
update runs with every aten op timed (``OpTimer``, a dispatch mode), with FLOPs counted for the
matmuls (aten::mm, addmm, bmm); the others are timed plainly, so the table can say how much the
timing itself adds. Each op, grouped by name and input shapes, goes to the first kind of work that
fits:

  matmul         aten::mm / addmm / bmm, forward and backward (the lm_head's too), with their
                 GFLOP/s against the probed peak;
  gradient sums  an add of two equal 2-D shapes, i.e. of two gradients of one weight (the
                 activations are 3-D): out of place, the two uses of a weight in one micro-batch
                 (the shared prompt prefix's forward and the completions') summed by autograd into
                 a fresh tensor; in place, each micro-batch's gradient accumulated into .grad;
  log-probs      any other op on a (..., vocab) tensor: ChunkedLogp's log-sum-exp, softmax and
                 gradient over the completion tokens' logits;
  attention      SDPA forward and backward (the flash kernel's matmuls are inside it, uncounted;
                 transformers' forward only: the packed trunk's attention is two bmms, counted as matmuls);
  embedding      the token embedding's lookup and its sparse gradient;
  optimizer      gradient clipping and the fused AdamW step;
  memory         copies, fills, casts, cat and the tensors they allocate;
  elementwise    norms, RoPE, SiLU, residual adds, the loss's arithmetic, and their backward;
  other          whatever no rule above names.
Writes benchmarks/results/update_cost-<isa>.{json,md}.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import machine  # benchmarks/machine.py: where the figures came from
import roofline  # benchmarks/roofline.py: the model's shape, the update's useful FLOPs
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlpost import cli
from rlpost.model import precision
from rlpost.observe import planner
from rlpost.roles import trainer

MICRO = 32  # vs_trl.py's micro-batch since 2026-11-26 (8 before; --set trainer.micro_batch_size=8)
MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
# By the op's own name, without "aten::" and leading or trailing underscores: equal to a key, or a
# key then "_" (silu_backward, foreach_norm, ...). After the matmul, gradient-sum and vocab rules.
KINDS = [
    ("attention", ("scaled_dot_product",)),
    ("log-probs", ("log_softmax", "logsumexp")),
    ("embedding", ("embedding", "index_add", "index_select", "sparse", "coalesce")),
    ("optimizer", ("fused_adamw", "adamw", "foreach", "linalg_vector_norm", "clip_grad_norm")),
    ("memory", ("copy", "to_copy", "fill", "zero", "zeros", "empty", "empty_strided", "clone", "cat",
                "contiguous", "resize", "ones", "full", "stack", "index_put", "index_put_impl", "new_zeros",
                "new_empty")),
    ("elementwise", ("mul", "add", "sub", "div", "pow", "mean", "rsqrt", "silu", "neg", "sum", "where",
                     "exp", "log", "cos", "sin", "masked_fill", "clamp", "minimum", "maximum", "sigmoid",
                     "tanh", "fused_rms_norm", "rms_norm", "reciprocal", "square", "amax", "max", "min", "gather",
                     "softmax", "softmax_backward_data", "threshold_backward", "lt", "gt", "eq", "ne", "le",
                     "ge", "logical_and", "logical_not", "sign", "abs")),
]


def grad_sum(name: str, shapes: list) -> bool:
    """An add of two equal 2-D shapes (the model's activations are 3-D): two gradients of one
    weight. Out of place (aten::add), autograd summing the two uses of a weight in one micro-batch's
    graph, the shared prompt prefix's forward and the completions', into a fresh tensor; in place
    (add_), a micro-batch's gradient accumulated into .grad."""
    return name in ("aten::add", "aten::add_") and len(shapes) >= 2 and len(shapes[0]) == 2 and shapes[0] == shapes[1]


def kind_of(name: str, shapes: list, vocab: int) -> str:
    if name in MATMUL:
        return "matmul"
    if grad_sum(name, shapes):
        return "gradient sums"
    if any(sh and sh[-1] == vocab for sh in shapes):  # the log-probs' (tokens, vocab) logits
        return "log-probs"
    base = name.split("::")[-1].strip("_")
    for kind, keys in KINDS:
        if any(base == k or base.startswith(k + "_") for k in keys):
            return kind
    return "other"


def padded(lengths: torch.Tensor) -> int:
    """Completion positions computed for rows of these lengths, in this order, MICRO rows a micro-batch."""
    return sum(len(c) * int(c.max()) for c in lengths.split(MICRO))


class OpTimer(TorchDispatchMode):
    """Times every aten op this thread runs, forward and backward (the CPU autograd engine runs the
    backward on the calling thread), by name and input shapes: (calls, seconds, FLOPs of matmuls).

    A dispatch mode and not torch.profiler: the profiler's own bookkeeping inflated some ops several
    times here (it charged 1.75 s to weight-gradient sums that take 0.20 s timed this way). Each
    time is the kernel's alone (ops a kernel calls inside are not seen again); the Python around it
    is not counted, so the ops add up to less than the wall time."""

    def __init__(self):
        super().__init__()
        self.ops: dict[tuple, list] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        dt = time.perf_counter() - t
        name = f"aten::{func.overloadpacket.__name__}"
        shapes = tuple(tuple(x.shape) if isinstance(x, torch.Tensor) else () for x in args)
        rec = self.ops.setdefault((name, shapes), [0, 0.0, 0])
        rec[0], rec[1] = rec[0] + 1, rec[1] + dt
        if name in MATMUL and len(shapes) >= 2:
            a_, b_ = shapes[-2:]  # (m, k) @ (k, n), batched: (b, m, k) @ (b, k, n); addmm's bias first
            rec[2] += 2 * a_[-2] * a_[-1] * b_[-1] * (a_[0] if len(a_) == 3 else 1)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="steps of training; the last one's update is timed op by op")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra rlpost override, e.g. trainer.prompts_once=false (micro-batches of whole groups)")
    a = ap.parse_args()
    header = machine.Header()
    plain, timed_s, ops, tokens, positions = [], [], [], {}, []
    update, micro, ran = trainer.Trainer.update, trainer.Trainer._micro, []

    def counted_micro(self, mb, *args):  # completion positions the trainer actually computes
        # the packed trunk runs a row's positions up to its last loss token; transformers' forward every column
        ran.append(int(mb.completion_mask.sum()) if self.packed else mb.completion_ids.numel())
        return micro(self, mb, *args)

    def timed_update(self, batch, loss_fn):
        # Completion positions each step computes (rows x their micro-batch's longest): as the trainer
        # formed its micro-batches ("computed"), and both ways it can form them: whole groups sorted by
        # their longest row (each micro-batch runs its groups' prompts), or rows sorted by their own
        # length across groups (the prompts run once per mini-batch, trainer.prompts_once).
        lengths = batch.completion_mask.sum(1)
        ran.clear()
        positions.append({"tokens": int(lengths.sum()), "now": padded(lengths[batch.length_order()]),
                          "rows_sorted": padded(lengths.sort().values)})
        if len(plain) < a.steps - 1:
            t = time.perf_counter()
            out = update(self, batch, loss_fn)
            plain.append(time.perf_counter() - t)
            positions[-1]["computed"] = sum(ran)
            return out
        timer = OpTimer()
        t = time.perf_counter()
        with timer:
            out = update(self, batch, loss_fn)
        timed_s.append(time.perf_counter() - t)
        positions[-1]["computed"] = sum(ran)
        tokens.update(completion=int(lengths.sum()), computed=sum(ran), sorted=sum(ran) == positions[-1]["rows_sorted"],
                      prompt=int(batch.prompt_mask[:: a.group].sum()))  # each group's prompt once (shared prefix)
        ops.extend({"op": name, "shapes": [list(x) for x in shapes], "calls": c, "s": sec, "flops": f}
                   for (name, shapes), (c, sec, f) in timer.ops.items())
        return out

    trainer.Trainer.update, trainer.Trainer._micro = timed_update, counted_micro
    out = Path(tempfile.mkdtemp())
    try:
        code = cli.main([
            "train", f"rollout.prompts_per_step={a.prompts}", f"rollout.group_size={a.group}",
            f"rollout.max_new_tokens={a.max_new}", "rollout.temperature=0.7", "trainer.lr=1e-5",
            f"run.steps={a.steps}", "run.seed=0", "run.eval_every=0", "run.checkpoint_every=0",
            "task.n_heldout=16", "run.progress=false", f"run.out_dir={out}", "run.name=run",
            f"trainer.micro_batch_size={MICRO}", *a.set,  # a --set of the micro-batch comes later and wins
        ])
        assert code == 0, f"rlpost train exited {code}"
    finally:
        trainer.Trainer.update, trainer.Trainer._micro = update, micro
        shutil.rmtree(out)

    choice = precision.choose()
    dev = planner.probed_cpu()
    peak = dev.bf16_flops if choice.bf16 else dev.fp32_flops
    m = roofline.model_shape()
    by_kind: dict[str, float] = {}
    for o in ops:
        o["kind"] = kind_of(o["op"], o["shapes"], m["vocab"])
        by_kind[o["kind"]] = by_kind.get(o["kind"], 0.0) + o["s"]
    total = sum(by_kind.values())
    mm_flops = sum(o["flops"] for o in ops if o["kind"] == "matmul")
    mm_s, wall = by_kind.get("matmul", 0.0), timed_s[0]
    # the roofline's count: 6 x params per token, prompts once, head on completions
    useful = 6 * m["trunk"] * (tokens["prompt"] + tokens["completion"]) + 6 * m["head"] * tokens["completion"]
    by_op: dict[tuple[str, str], float] = {}  # (kind, op name) -> seconds, over all shapes
    for o in ops:
        by_op[o["kind"], o["op"]] = by_op.get((o["kind"], o["op"]), 0.0) + o["s"]

    def top(kind: str, n: int = 4) -> str:
        parts = [f"{op.removeprefix('aten::')} {sec:.2f}"
                 for (k, op), sec in sorted(by_op.items(), key=lambda kv: -kv[1])
                 if k == kind]
        return ", ".join(parts[:n])
    lines = [f"`rlpost train` with vs_trl.py's configuration ({a.prompts} prompts x {a.group}, <= {a.max_new} new "
             f"tokens, micro-batch {MICRO}{''.join(f', {kv}' for kv in a.set)}, "
             f"{'bf16 autocast' if choice.bf16 else 'float32'}), {a.steps} steps; "
             f"step {a.steps}'s update timed op by op (OpTimer).", "",
             f"Update wall time, plain: {', '.join(f'{x:.2f}' for x in plain)} s (steps 1-{a.steps - 1}, other "
             f"batches); step {a.steps}: {wall:.2f} s timed op by op, of which the ops' own times are {total:.2f} s. "
             f"Shares are of step {a.steps}'s {wall:.2f} s.", "",
             "| kind of work | s | share | note |", "|---|---|---|---|"]
    notes = {"matmul": f"{mm_flops / 1e9:.0f} GFLOP at {mm_flops / mm_s / 1e9:.0f} GFLOP/s, "
                       f"{mm_flops / mm_s / peak:.2f} of the probed peak {peak / 1e9:.0f}" if mm_s else "",
             **{k: top(k) for k in ("elementwise", "other", "memory", "log-probs", "attention")},
             "gradient sums": ("two uses of a weight summed out of place {:.2f} s; micro-batches into .grad in place "
                               "{:.2f} s").format(
                 *(sum(o["s"] for o in ops if o["kind"] == "gradient sums" and o["op"] == op)
                   for op in ("aten::add", "aten::add_")))}
    for kind, sec in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {kind} | {sec:.2f} | {sec / wall:.0%} | {notes.get(kind, '')} |")
    calls = sum(o["calls"] for o in ops)
    lines.append(f"| outside the ops | {wall - total:.2f} | {(wall - total) / wall:.0%} | Python, autograd's "
                 f"bookkeeping, the timer's own cost ({calls} op calls timed) |")
    padding = 6 * m["trunk"] * (tokens["computed"] - tokens["completion"])
    lines += ["", f"The timed batch: {tokens['completion']} completion tokens, {tokens['prompt']} prompt tokens "
              f"(each group's once). The roofline counts {useful / 1e9:.0f} GFLOP of useful work for it; the matmuls "
              f"did {mm_flops / 1e9:.0f} ({mm_flops / useful:.2f}x; attention's bmms and the lm_head's are in both). "
              f"Through the trunk: {tokens['computed']} completion positions for {tokens['completion']} tokens, "
              f"{padding / 1e9:.0f} GFLOP of padding.",
              f"At the peak, the useful FLOPs would take {useful / peak:.2f} s, the counted ones {mm_flops / peak:.2f} "
              f"s: {useful / peak / wall:.0%} and {mm_flops / peak / wall:.0%} of this update's {wall:.2f} s "
              f"(= {mm_flops / useful:.2f}x the FLOPs, the matmuls at {mm_flops / mm_s / peak:.2f} of peak, "
              f"and {1 - mm_s / wall:.0%} of the time outside them)."]
    now, free = sum(x["now"] for x in positions), sum(x["rows_sorted"] for x in positions)
    done = sum(x["computed"] for x in positions)
    lines += ["", f"Completion positions over the {a.steps} steps, for {sum(x['tokens'] for x in positions)} "
              f"tokens: {done} computed; {now} with micro-batches of whole groups, {free} with rows sorted by length "
              f"across groups ({free / now - 1:+.0%}); by step, computed / whole groups / sorted: "
              + ", ".join(f"{x['computed']} / {x['now']} / {x['rows_sorted']}" for x in positions) + "."]
    text = "\n".join(lines) + "\n"
    print(header.render() + text)
    machine.write_results("update_cost", {"plain_s": plain, "timed_s_s": timed_s, "ops_s": total,
                                          "by_kind_s": by_kind, "matmul_flops": mm_flops, "peak_flops": peak,
                                          "useful_flops": useful, "tokens": tokens,
                                          "op_calls": sum(o["calls"] for o in ops), "positions": positions,
                                          "padding_flops": padding,
                                          "by_op_s": {f"{k}: {op}": sec for (k, op), sec in
                                                      sorted(by_op.items(), key=lambda kv: -kv[1])},
                                          "ops": sorted(ops, key=lambda o: -o["s"])[:60]},
                          header, text)


if __name__ == "__main__":
    main()
