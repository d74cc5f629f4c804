"""Kernels per decode step and per trainer micro-batch, counted on the CPU: what a GPU launches.

    .venv/bin/python benchmarks/kernel_count.py             # the demo's and the 0.5B row's shapes; ~2 min on 2 cores

On a GPU a step of a small model costs its kernel launches (issue 37: transformers' `generate` took
27.7 ms a decode step of a 0.5B model at 128 rows on an H100, whose weights it reads in 0.25 ms).
The number of kernels does not depend on the model's width, only on its layers, the tokens per
``ChunkedLogp`` chunk and the code path; so it can be counted here, on narrow models with the real
layer counts and vocabulary. Each aten op that reaches a backend kernel (a dispatch mode below
autograd, so backward ops count too) is one kernel, leaving out the ops that only make a view
(``VIEWS``). The planner's GPU latency term (observe/cost.py) multiplies these counts by a time per
kernel calibrated on the issue's H100 figures.

Counted, each on the demo's shape (SmolLM2-135M: 30 layers) and the 0.5B row's (Qwen2.5-0.5B: 24
layers, q/k/v biases), vocabulary 49152:
  decode step   transformers' `generate` (difference of two lengths), the CPU loop's ``_step``
                (rollout_fast.py) and the GPU path's ``_advance`` (rollout_static.py), the step a
                CUDA graph captures: per layer and fixed, from the two layer counts;
  micro-batch   one trainer micro-batch's forward and backward, on transformers' forward (what the
                issue's H100 run had), on the packed trunk with SDPA (what the 2026-11-27 H100 run
                had) and with its CUDA branch (model/packed.py: on_gpu; torch's fused RMSNorm counted
                as CUDA's one kernel forward and two back, not the CPU's ~20 ops): per
                layer, per ChunkedLogp chunk and fixed, from small batches (the count does not
                depend on the tokens, only on the chunks: the planner counts those);
  update        what an update adds once: clipping, AdamW, the metrics.
Writes benchmarks/results/kernel_count-<isa>.{json,md}.
"""

from __future__ import annotations

import argparse
import copy
from contextlib import contextmanager, nullcontext

import machine  # benchmarks/machine.py: where the figures came from
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlpost import algorithms, build, config
from rlpost.model import logprobs, packed
from rlpost.roles.rollout_fast import FastRollout
from rlpost.roles.rollout_static import StaticRollout
from rlpost.types.batch import Rollouts

VOCAB = 49152
# ops that only make a view or reinterpret metadata: no kernel on a GPU
VIEWS = {"view", "_unsafe_view", "as_strided", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze",
         "select", "slice", "detach", "alias", "split", "split_with_sizes", "chunk", "unbind", "lift_fresh",
         "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_reshape_alias", "reshape",
         "view_as", "numpy_T", "_to_copy_meta", "is_nonzero", "_local_scalar_dense", "sym_size", "sym_stride",
         "resolve_conj", "resolve_neg", "diagonal", "narrow", "set_", "unfold", "movedim"}


class Count(TorchDispatchMode):
    current: "Count | None" = None  # the count running (FusedNorm adds its kernels to it)
    paused = 0  # inside FusedNorm: its CPU ops stand in for CUDA's kernels and are not counted

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not Count.paused and func.overloadpacket.__name__.strip("_") not in {v.strip("_") for v in VIEWS}:
            self.n += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def uncounted():
    Count.paused += 1
    try:
        yield
    finally:
        Count.paused -= 1


RMS_NORM = torch.nn.functional.rms_norm


class FusedNorm(torch.autograd.Function):
    """torch's rms_norm with a weight as CUDA runs it (``_fused_rms_norm``): one kernel forward, two
    back (the input's gradient; the weight's, a reduction over the tokens). On the CPU torch writes it
    out in ~20 ops; here they compute it and the count takes CUDA's three. It keeps what CUDA's keeps
for the backward (x and the weight; CUDA adds one 1/rms a token), for benchmarks/update_memory.py."""

    @staticmethod
    def forward(ctx, x, shape, w, eps):
        ctx.save_for_backward(x, w)
        ctx.shape, ctx.eps = shape, eps
        if Count.current is not None:
            Count.current.n += 1
        with uncounted():
            return RMS_NORM(x, shape, w, eps)

    @staticmethod
    def backward(ctx, g):
        if Count.current is not None:
            Count.current.n += 2
        with uncounted(), torch.enable_grad():
            x, w = (t.detach().requires_grad_() for t in ctx.saved_tensors)
            dx, dw = torch.autograd.grad(RMS_NORM(x, ctx.shape, w, ctx.eps), (x, w), g)
        return dx, None, dw, None


@contextmanager
def gpu_kernels():
    """The packed trunk's CUDA branch on the CPU (model/packed.py: on_gpu), its norms counted as CUDA's."""
    on_gpu = packed.on_gpu
    packed.on_gpu = lambda x: True
    torch.nn.functional.rms_norm = lambda x, shape, w=None, eps=None: FusedNorm.apply(x, shape, w, eps)
    try:
        yield
    finally:
        packed.on_gpu, torch.nn.functional.rms_norm = on_gpu, RMS_NORM


def count(fn) -> int:
    with Count() as c:
        Count.current = c
        try:
            fn()
        finally:
            Count.current = None
    return c.n


SHAPES = {  # name: (config class, model class, layers, heads, kv heads, q/k/v bias)
    "demo (SmolLM2-135M)": (LlamaConfig, LlamaForCausalLM, 30, 9, 3),
    "0.5B row (Qwen2.5-0.5B)": (Qwen2Config, Qwen2ForCausalLM, 24, 14, 2),
}


def model(shape: str, layers: int) -> torch.nn.Module:
    cfg_cls, model_cls, _, heads, kv = SHAPES[shape]
    cfg = cfg_cls(vocab_size=VOCAB, hidden_size=8 * heads, intermediate_size=64, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=True, pad_token_id=0,
                  eos_token_id=2, max_position_embeddings=4096)
    torch.manual_seed(0)
    return model_cls(cfg).float().eval()


class Tok:  # what the engines read of a tokenizer here
    pad_token_id, eos_token_id = 0, 2


@torch.no_grad()
def decode_counts(shape: str) -> dict[str, tuple[float, float]]:
    """engine -> (kernels per layer, fixed kernels) of one decode step at 8 rows."""
    per: dict[str, dict[int, float]] = {"generate": {}, "fast _step": {}, "static _advance": {}}
    for layers in (2, 4):
        m = model(shape, layers)
        ids = torch.randint(3, VOCAB, (8, 12))
        mask = torch.ones_like(ids)
        steps = {}
        for new in (4, 8):
            g = GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=True, top_k=0, temperature=1.0,
                                 pad_token_id=0, eos_token_id=2)
            steps[new] = count(lambda: m.generate(input_ids=ids, attention_mask=mask, generation_config=g))
        per["generate"][layers] = (steps[8] - steps[4]) / 4
        fast = FastRollout(copy.deepcopy(m), Tok(), dtype=torch.float32)
        fast.hf.eos_ids = torch.tensor([-1])  # no row ever finishes: every step runs
        per["fast _step"][layers] = _per_step(lambda n: fast._decode(ids, mask.bool(), 1, 1.0, 1.0, n))
        static = StaticRollout(copy.deepcopy(m), Tok(), dtype=torch.float32)
        static.hf.eos_ids = static.eos_dev = torch.tensor([-1])
        a = static._arena_for(8, 64)
        static._prepare(a, [8], 1.0, 1.0)
        per["static _advance"][layers] = count(lambda: static._advance(a, 8, 1.0, 1.0))
    return {k: ((v[4] - v[2]) / 2, v[2] - 2 * (v[4] - v[2]) / 2) for k, v in per.items()}


def _per_step(decode) -> float:
    return (count(lambda: decode(9)) - count(lambda: decode(5))) / 4


def batch(rows: int, prompt: int, completion: int, groups: int) -> Rollouts:
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, VOCAB, (groups, prompt), generator=g).repeat_interleave(rows // groups, 0)
    b = Rollouts(prompt_ids=prompts, prompt_mask=torch.ones_like(prompts, dtype=torch.bool),
                 completion_ids=torch.randint(3, VOCAB, (rows, completion), generator=g),
                 completion_mask=torch.ones(rows, completion, dtype=torch.bool),
                 sampler_logp=torch.zeros(rows, completion),
                 truncated=torch.ones(rows, dtype=torch.bool),
                 group_ids=torch.arange(groups).repeat_interleave(rows // groups), rows=[{}] * rows,
                 completions=[""] * rows)
    b.advantages = torch.randn(rows, completion, generator=g)
    return b


@contextmanager
def chunks(tokens: int | None, sdpa: bool):
    """ChunkedLogp's chunks of ``tokens`` (None: one chunk for the whole micro-batch), and the packed
    trunk's SDPA (packed.attention's GPU branch) when ``sdpa``."""
    chunk, saved = logprobs.chunk_tokens, packed.SAVED_BYTES
    logprobs.chunk_tokens = lambda on_gpu, vocab: tokens or 10**9
    packed.SAVED_BYTES = 0 if sdpa else saved
    try:
        yield
    finally:
        logprobs.chunk_tokens, packed.SAVED_BYTES = chunk, saved


ROWS, MICRO, PROMPT, COMPLETION = 16, 4, 12, 8  # small: the counts do not depend on the tokens, only on the chunks


def update_counts(shape: str) -> dict[str, dict]:
    """path -> {micro_batch: (per layer, fixed, per chunk), update_fixed} of a trainer update: the
    forward and backward of each micro-batch, and what the update adds once (clip, AdamW, metrics).
    Micro-batches of 4 rows against 8 give the per micro-batch count; 2 and 4 layers the per layer
    count; ChunkedLogp in 8-token chunks against one chunk the per chunk count. The prompts run once
    per mini-batch, ahead of its micro-batches (trainer.prompts_once, the default): counted in the
    update's own."""
    out = {}
    for path, forward in (("hf forward", "hf"), ("packed", "packed"), ("packed, CUDA kernels", "packed")):
        totals = {}
        for layers, micro, chunk in ((2, MICRO, None), (2, 2 * MICRO, None), (4, MICRO, None), (2, MICRO, 8)):
            cfg = config.load(None, ["model.name=tiny", "trainer.precision=bf16", f"trainer.forward={forward}",
                                     f"trainer.micro_batch_size={micro}",
                                     "rollout.prompts_per_step=4", "rollout.group_size=4"])
            trainer = build.make_trainer(cfg, model(shape, layers).train(), False)
            loss = algorithms.build(cfg.algo, cfg.rollout.group_size, cfg.rollout.max_new_tokens).loss
            b = batch(ROWS, PROMPT, COMPLETION, 4)
            with chunks(chunk, sdpa=True), gpu_kernels() if "CUDA" in path else nullcontext():
                trainer.update(copy.deepcopy(b), loss)  # warm: the first update allocates the optimizer state
                totals[layers, micro, chunk] = count(lambda: trainer.update(copy.deepcopy(b), loss))
        n_micro = ROWS // MICRO
        per_micro = (totals[2, MICRO, None] - totals[2, 2 * MICRO, None]) / (n_micro - n_micro // 2)
        per_layer = (totals[4, MICRO, None] - totals[2, MICRO, None]) / (2 * n_micro)
        per_chunk = (totals[2, MICRO, 8] - totals[2, MICRO, None]) / (n_micro * (MICRO * COMPLETION // 8 - 1))
        out[path] = {"micro_batch": (per_layer, per_micro - 2 * per_layer - per_chunk, per_chunk),
                     "update_fixed": totals[2, MICRO, None] - n_micro * per_micro}
    return out


def report(result: dict) -> str:
    lines = ["Kernels (aten ops reaching a backend kernel, views left out), counted on the CPU with narrow models of",
             "the real layer counts and a 49152-token vocabulary; a GPU launches about this many.", "",
             "| shape | decode step (8 rows) | kernels per layer | fixed | at the shape's layers |",
             "|---|---|---|---|---|"]
    for shape, (_, _, layers, _, _) in SHAPES.items():
        for engine, (per, fixed) in result[shape]["decode"].items():
            lines.append(f"| {shape} | {engine} | {per:.1f} | {fixed:.1f} | {per * layers + fixed:.0f} |")
    lines += ["", "| shape | trainer micro-batch (forward + backward) | per layer | per ChunkedLogp chunk | fixed | "
              "at the shape's layers, 1 chunk | update's own (clip, AdamW, metrics) |", "|---|---|---|---|---|---|---|"]
    for shape, (_, _, layers, _, _) in SHAPES.items():
        for path, c in result[shape]["update"].items():
            per, fixed, chunk = c["micro_batch"]
            lines.append(f"| {shape} | {path} | {per:.1f} | {chunk:.1f} | {fixed:.0f} | "
                         f"{per * layers + fixed + chunk:.0f} | {c['update_fixed']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args()
    torch.set_num_threads(2)
    header = machine.Header()
    result = {}
    for shape in SHAPES:
        print(shape, flush=True)
        result[shape] = {"decode": decode_counts(shape), "update": update_counts(shape)}
    text = report(result)
    print(text)
    machine.write_results("kernel_count", result, header, text)


if __name__ == "__main__":
    main()
