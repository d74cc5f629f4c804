"""A rollout worker's chunks decoded one at a time against as one stream (roles/chunk_stream.py), on the
embedded model and a long-tailed mix: the sampling half of partial rollouts (issue 52's async target).

    .venv/bin/python benchmarks/chunk_stream.py                 # 2 reps, the arms alternating within each rep
    .venv/bin/python benchmarks/chunk_stream.py --reps 1 --long 64

The work: --chunks chunks of 4 prompts x 4 samples at T = 0.7, <= --long new tokens. In each chunk one
prompt asks for a long story (its 4 rows run to the cap) and three ask for a sum (a few tokens), so a
chunk decoded alone spends most of its steps on 4 of its 16 rows.

Arms (completion tokens up to EOS per second over the whole stream of chunks, median over reps):
  by_chunk  each chunk its own decode, one after another: what a worker holding one chunk at a time does
            (FastRollout.generate, its hook between steps set as under partial rollouts)
  stream    the worker's ChunkStream with two chunks in flight, as the pool hands them under partial
            rollouts: the next chunk's rows join the running decode
Both arms draw each chunk under the same seed. Writes results/chunk_stream-<isa>.md and .json.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import threading
import time

import machine
import torch

from rlpost.model.load import load_policy
from rlpost.roles.chunk_stream import ChunkStream
from rlpost.roles.rollout_fast import FastRollout

PROMPTS, GROUP, TEMPERATURE = 4, 4, 0.7
STORIES = ("a lighthouse keeper", "a lost robot", "two rival bakers", "a dragon who cannot fly")


def chunk(c: int) -> list[dict]:
    out = []
    for i in range(PROMPTS):
        if i == c % PROMPTS:
            text = f"Write a long, detailed story about {STORIES[c % len(STORIES)]}. Use many paragraphs."
        else:
            a, b = 3 + 7 * (c * PROMPTS + i) % 17, 2 + 5 * (c * PROMPTS + i) % 13
            text = f"What is {a} + {b}? Reply with only the number."
        out.append({"messages": [{"role": "user", "content": text}]})
    return out


def by_chunk(engine, chunks: list[list[dict]], kw: dict, seed: int) -> tuple[int, int]:
    tokens = steps = 0
    for c, rows in enumerate(chunks):
        torch.manual_seed(seed + c)
        tokens += int(engine.generate(rows, GROUP, **kw).completion_mask.sum())
        steps += engine.last_metrics["rollout/decode_steps"]
    return tokens, steps


def streamed(engine, chunks: list[list[dict]], kw: dict, seed: int) -> tuple[int, int]:
    """Each chunk submitted from its own thread, at most two in flight (the pool's depth)."""
    stream, room, got = ChunkStream(engine), threading.Semaphore(2), []

    def go(c, rows):
        try:
            got.append(int(stream.submit(rows, GROUP, kw, seed + c)[0].completion_mask.sum()))
        finally:
            room.release()

    threads = []
    for c, rows in enumerate(chunks):
        room.acquire()
        threads.append(threading.Thread(target=go, args=(c, rows)))
        threads[-1].start()
    for t in threads:
        t.join()
    return sum(got), stream.decodes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--long", type=int, default=128, help="max new tokens (the story rows' length)")
    args = ap.parse_args()
    header = machine.Header()
    loaded = load_policy("embedded")
    engine = FastRollout(copy.deepcopy(loaded.model), loaded.tokenizer)
    engine.between_steps = lambda e: None  # as a worker under partial rollouts runs it
    chunks = [chunk(c) for c in range(args.chunks)]
    kw = dict(temperature=TEMPERATURE, top_p=1.0, max_new_tokens=args.long)
    arms = {"by_chunk": by_chunk, "stream": streamed}
    results, tokens, counts = {n: [] for n in arms}, {}, {}
    for rep in range(args.reps + 1):  # rep 0 warms up (oneDNN packing, first allocations)
        for name, fn in arms.items():
            t = time.perf_counter()
            tokens[name], counts[name] = fn(engine, chunks, kw, 1000 * rep)
            if rep:
                results[name].append(tokens[name] / (time.perf_counter() - t))
        print(f"rep {rep} done", flush=True)
    med = {n: statistics.median(v) for n, v in results.items()}
    lines = [f"{args.reps} reps, {args.chunks} chunks of {PROMPTS} prompts x {GROUP} samples (one prompt a chunk a "
             f"story), T = {TEMPERATURE}, <= {args.long} new tokens; completion tokens (up to EOS) per second over "
             f"the stream, median. torch threads: {torch.get_num_threads()}.", "",
             "| arm | tok/s | vs by_chunk | tokens (last rep) | decode steps (by_chunk), decodes (stream): last rep |",
             "|---|---|---|---|---|"]
    lines += [f"| {n} | {med[n]:.0f} | {med[n] / med['by_chunk']:.2f}x | {tokens[n]} | {counts[n]} |" for n in arms]
    text = "\n".join(lines) + "\n"
    print(text)
    machine.write_results("chunk_stream", {"tok_s": results, "median": med, "tokens": tokens, "counts": counts,
                                           "reps": args.reps, "chunks": args.chunks, "long": args.long}, header, text)


if __name__ == "__main__":
    main()
