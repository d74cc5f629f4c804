"""How close each phase of a GRPO step is to this machine's limits.

    .venv/bin/python benchmarks/roofline.py        # reads results/vs_trl-<isa>.json (run vs_trl.py first)

Measures the machine's ceilings here (bf16 and fp32 2048^3 GEMM, and memory bandwidth as a
112 MB copy), counts the work of one step of the speed benchmark's configuration from the
model's shape and the measured completion lengths, and divides by the measured phase times.
The limit is that of the precision the run used, as rlpost's probe picks it on this machine:
the bf16 GEMM peak where bf16 is fast (AVX-512 BF16), the fp32 one elsewhere (AVX2), with the
sampler's weights at 2 or 4 bytes.

* Rollout: prefill is compute (2 x params FLOPs per prompt token, each prompt once); each decode
  step reads every sampler weight once whatever the batch (32 rows x 576 is far too little work
  per weight byte to be compute bound), so its floor is weight bytes / bandwidth per decode step.
* Update: forward + backward = 6 x params FLOPs per token, on the trunk for prompt and completion
  tokens and on the lm_head for completion tokens only (ChunkedLogp scores only those).
Writes benchmarks/results/roofline-<isa>.md (<isa> = avx2, avx512: this CPU's kind).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

import machine  # benchmarks/machine.py: where the figures came from

HERE = Path(__file__).resolve().parent


def gemm_gflops(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n**3 / min(times) / 1e9


def bandwidth_gbs(mb: int = 112, reps: int = 10) -> float:
    src = torch.randn(mb * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = min(_timed(lambda: dst.copy_(src)) for _ in range(reps))
    return 2 * src.numel() * 4 / t / 1e9  # read + write


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def model_shape() -> dict:
    from rlpost.model.load import embedded_model_dir

    c = json.loads((embedded_model_dir() / "config.json").read_text())
    H, I, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    hd = c.get("head_dim") or H // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    per_layer = H * H * 2 + H * kv * 2 + 3 * H * I  # q, o, k, v, gate, up, down
    return {"trunk": per_layer * L, "head": V * H, "layers": L, "kv": kv, "vocab": V}


def main() -> None:
    from rlpost.model import precision

    header, tag = machine.Header(), machine.isa_tag()
    bf16 = precision.choose().bf16  # the precision vs_trl.py's runs used on this machine
    # bf16 GEMM at 2048^3 takes ~25 s where bf16 is slow (AVX2): measure it smaller there.
    peak_bf16 = gemm_gflops(torch.bfloat16, 2048 if bf16 else 512, 5 if bf16 else 1)
    peak_fp32, bw = gemm_gflops(torch.float32), bandwidth_gbs()
    peak, dname, wbytes = (peak_bf16, "bf16", 2) if bf16 else (peak_fp32, "fp32", 4)
    bench = json.loads((HERE / "results" / f"vs_trl-{tag}.json").read_text())
    m = model_shape()
    from rlpost import config
    from rlpost.envs import build_task
    from rlpost.model.load import load_tokenizer

    tok = load_tokenizer("embedded")
    rows = build_task(config.load(None, []).task).train[:64]
    prompt_len = statistics.mean(
        len(tok(tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False),
                add_special_tokens=False).input_ids) for r in rows)
    steps = [s for r in bench["runs"]["rlpost"] for s in r["steps"][1:]]
    gen_tokens = statistics.median(s["tokens"] for s in steps)  # completion tokens per step (32 rows)
    prompts, rows_n, max_new = 8, 32, 64
    # Rollout: prefill FLOPs at the GEMM peak + one read of the sampler's weights per decode step at the measured
    # bandwidth.
    prefill_flops = 2 * m["trunk"] * prompts * prompt_len
    weight_bytes = wbytes * (m["trunk"] + m["head"])
    rollout_floor = prefill_flops / (peak * 1e9) + max_new * weight_bytes / (bw * 1e9)
    decode_flops = 2 * (m["trunk"] + m["head"]) * gen_tokens
    # Update: 6 x params per token; trunk over every prompt once plus each row's completion, head on completion tokens.
    update_flops = 6 * m["trunk"] * (prompts * prompt_len + gen_tokens) + 6 * m["head"] * gen_tokens
    update_floor = update_flops / (peak * 1e9)
    ours, trl = bench["rlpost"], bench["trl"]
    lines = [
        f"Machine: bf16 GEMM {peak_bf16:.0f} GFLOP/s, fp32 GEMM {peak_fp32:.0f} GFLOP/s (2048^3), "
        f"memory copy {bw:.1f} GB/s (read + write). Limit used: {dname} (the precision of the runs).",
        f"Step (speed benchmark): {prompts} prompts x 4, prompt {prompt_len:.0f} tokens, "
        f"{gen_tokens:.0f} completion tokens (median), at most {max_new} decode steps.", "",
        "| phase | work | floor on this machine | rlpost measured | % of limit | TRL measured | % of limit |",
        "|---|---|---|---|---|---|---|",
        f"| rollout | prefill {prefill_flops / 1e9:.0f} GFLOP + {max_new} reads of {weight_bytes / 1e6:.0f} MB {dname} "
        f"weights (decode {decode_flops / 1e9:.0f} GFLOP) | {rollout_floor:.2f} s | {ours['gen_s']:.2f} s | "
        f"{100 * rollout_floor / ours['gen_s']:.0f}% | {trl['gen_s']:.2f} s | "
        f"{100 * rollout_floor / trl['gen_s']:.0f}% |",
        f"| update | {update_flops / 1e12:.2f} TFLOP (fwd + bwd) | {update_floor:.2f} s at {dname} peak | "
        f"{ours['update_s']:.2f} s | {100 * update_floor / ours['update_s']:.0f}% | {trl['update_s']:.2f} s | "
        f"{100 * update_floor / trl['update_s']:.0f}% |",
    ]
    text = header.render() + "\n".join(lines) + "\n"
    print(text)
    (HERE / "results" / f"roofline-{tag}.md").write_text(text)


if __name__ == "__main__":
    main()
