"""Peak memory of a trainer update on the packed trunk's CUDA branch, measured on the CPU.

    .venv/bin/python benchmarks/update_memory.py        # ~1 min on 2 cores

On the H100 (2026-11-27, benchmarks/results/gpu.md) the 0.5B row's update peaked at 27.3 GiB against
TRL's 22.6. This replays that update's memory on the CPU at a smaller scale: a Qwen2.5-0.5B-wide model
(hidden 896, MLP 4864, 14 heads over 2 kv heads, q/k/v biases, SmolLM2's 49152 vocabulary) with
LAYERS layers, ROWS rows of PROMPT + COMPLETION tokens in micro-batches of MICRO rows, bf16 autocast
over float32 masters, and reads the peak of the bytes held by live tensors during ``Trainer.update``
(a dispatch mode that sees every tensor an op makes and when its storage is freed: what
``torch.cuda.max_memory_allocated`` reads on a GPU, less the allocator's rounding). Parameters,
gradients and AdamW's state are allocated before it and left out: the figure is what the update adds.

Four ways, one run each:
  transformers' forward   trainer.forward=hf, the layout the planner prices (TRL's forward is this one)
  packed, as on the H100  the packed trunk's CPU branch with SDPA, and the lm_head's gradient held for
                          every micro-batch of the mini-batch (what ran on 2026-11-27)
  packed, head flushed    the first, the head's gradient flushed after each micro-batch (budget 0, a GPU's)
  packed, CUDA branch     model/packed.py's on_gpu (fused RMSNorm keeping x and 1/rms; SiluMul) and the
                          head's gradient flushed after each micro-batch (budgets.head_grad_bytes)
The peak is the largest of the update's moments (a micro-batch's backward, with its layers' activations;
the lm_head's gradient formed from what ``HeadGrad`` held), so the figures do not scale to another
model by layers or tokens: docs/gpu.md works out the 0.5B row's from the parts.
Writes benchmarks/results/update_memory-<isa>.{json,md}.
"""

from __future__ import annotations

import argparse
import copy
from contextlib import contextmanager, nullcontext

import machine  # benchmarks/machine.py: where the figures came from
import torch
from kernel_count import batch, gpu_kernels  # the CUDA branch on the CPU, its norms keeping what CUDA's keep
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlpost import algorithms, build, config
from rlpost.model import budgets

VOCAB, HIDDEN, MLP = 49152, 896, 4864
ROWS, GROUP, MICRO, PROMPT, COMPLETION = 32, 8, 8, 24, 256
LAYERS = (1, 2)


class Peak(TorchDispatchMode):
    """Bytes of the storages that ops made and that are still alive, and their peak."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.now = self.peak = 0
        self.at = ""  # the op that made the peak

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.now -= self.live.pop(key)[1]
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.layout == torch.strided:
                st = t.untyped_storage()
                if st._cdata not in self.live:
                    self.live[st._cdata] = (StorageWeakRef(st), st.nbytes())
                    self.now += st.nbytes()
        if self.now > self.peak:
            self.peak, self.at = self.now, func.overloadpacket.__name__
        return out


def model(layers: int) -> torch.nn.Module:
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=MLP, num_hidden_layers=layers,
                      num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True, pad_token_id=0,
                      eos_token_id=2, max_position_embeddings=4096, use_sliding_window=False)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg)


@contextmanager
def head_grad_budget(budget: int | None):
    real = budgets.head_grad_bytes
    if budget is not None:
        budgets.head_grad_bytes = lambda on_gpu: budget
    try:
        yield
    finally:
        budgets.head_grad_bytes = real


WAYS = {  # name: (trainer.forward, the CUDA branch, the head's gradient budget: None = the CPU's)
    "transformers' forward": ("hf", False, 2**62),
    "packed, as on the H100": ("packed", False, 2**62),
    "packed, head flushed each micro-batch": ("packed", False, 0),
    "packed, CUDA branch": ("packed", True, 0),
}


def peak(way: str, layers: int) -> tuple[int, str]:
    forward, cuda, budget = WAYS[way]
    cfg = config.load(None, [f"trainer.forward={forward}", "trainer.precision=bf16",
                             f"trainer.micro_batch_size={MICRO}", f"rollout.prompts_per_step={ROWS // GROUP}",
                             f"rollout.group_size={GROUP}"])
    trainer = build.make_trainer(cfg, model(layers).train(), False)
    loss = algorithms.build(cfg.algo, cfg.rollout.group_size, cfg.rollout.max_new_tokens).loss
    b = batch(ROWS, PROMPT, COMPLETION, ROWS // GROUP)
    with head_grad_budget(budget), gpu_kernels() if cuda else nullcontext():
        trainer.update(batch(GROUP, PROMPT, 8, 1), loss)  # a small first update allocates the grads and AdamW's state
        with Peak() as p:
            trainer.update(copy.deepcopy(b), loss)
    return p.peak, p.at


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args()
    torch.set_num_threads(2)
    header = machine.Header()
    result = {way: {n: peak(way, n) for n in LAYERS} for way in WAYS}
    for way, r in result.items():
        print(way, r, flush=True)
    lo, hi = LAYERS
    mib = 2**20
    lines = ["Peak bytes held by live tensors during a trainer update, beyond the weights, gradients and AdamW state",
             f"allocated before it: a Qwen2.5-0.5B-wide model with {lo} and {hi} layers, {ROWS} rows of {PROMPT} + "
             f"{COMPLETION} tokens in",
             f"micro-batches of {MICRO} rows ({MICRO * COMPLETION} fed tokens each), bf16 autocast; the op that made "
             "the peak beside it.", "",
             f"| way | {lo} layer (MiB) | at | {hi} layers (MiB) | at | {hi} layers, against the H100's code |",
             "|---|---|---|---|---|---|"]
    base = result["packed, as on the H100"][hi][0]
    for way, r in result.items():
        lines.append(f"| {way} | {r[lo][0] / mib:.0f} | {r[lo][1]} | {r[hi][0] / mib:.0f} | {r[hi][1]} | "
                     f"{r[hi][0] / base:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    machine.write_results("update_memory", {w: {str(n): list(v) for n, v in r.items()} for w, r in result.items()},
                          header, text)


if __name__ == "__main__":
    main()
