"""Evaluation at a fixed sampling budget: pass@1, unbiased pass@k and maj@k, per-sample records.

``rlpost eval TARGET --samples S`` draws S completions of every held-out problem at the sampling
temperature, scores each with the task's verifier, and reports

  pass@1   the mean correctness of all samples (the sampled, not greedy, accuracy)
  pass@k   Chen et al.'s unbiased estimator from the S samples, for each k <= S asked for
  maj@k    whether the most common answer among the first k samples is correct (self-consistency)

next to the greedy accuracy (one sample, temperature 0). Majority voting needs an answer, not a
completion: it is the verifier's parsed answer (``pred``, ``parsed`` or ``extracted`` in its
info), or else the stripped completion. Every sample is written to a JSONL file, so any number
can be recomputed or inspected later.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlpost.envs import is_correct
from rlpost.search.metrics import maj_at_k, pass_at_k


def answer_key(info: dict, completion: str) -> str | None:
    for key in ("pred", "parsed", "extracted"):
        if isinstance(info.get(key), str):
            return info[key]
    return completion.strip() or None


def sample_records(roles, rows: list[dict], samples: int, temperature: float, top_p: float, max_new_tokens: int,
                   batch_size: int) -> list[dict]:
    """One record per (problem, sample): problem index, sample index, completion, answer, correct."""
    records = []
    per_call = max(1, batch_size // samples)
    for i in range(0, len(rows), per_call):
        batch = roles.rollout.generate(rows[i : i + per_call], n=samples, temperature=temperature, top_p=top_p,
                                       max_new_tokens=max_new_tokens)
        rewards, infos, _ = roles.grader.score(batch)
        for j, (row, completion, r, info) in enumerate(zip(batch.rows, batch.completions, rewards.tolist(), infos)):
            records.append({"problem": i + j // samples, "sample": j % samples,
                            "prompt": row["messages"][-1]["content"], "completion": completion,
                            "gold": row.get("answer"), "answer": answer_key(info, completion), "reward": r,
                            "correct": is_correct(info, r)})
    return records


def summarise(records: list[dict], ks: list[int]) -> dict:
    """pass@1, pass@k and maj@k (averaged over problems) from per-sample records."""
    by_problem: dict[int, list[dict]] = {}
    for rec in records:
        by_problem.setdefault(rec["problem"], []).append(rec)
    out = {"problems": len(by_problem)}
    for k in ks:
        pk, mk = [], []
        for recs in by_problem.values():
            recs = sorted(recs, key=lambda r: r["sample"])
            n, c = len(recs), sum(r["correct"] for r in recs)
            if k > n:
                raise ValueError(f"k={k} is more than the {n} samples drawn per problem (--samples)")
            right = {r["answer"] for r in recs if r["correct"]}
            pk.append(pass_at_k(n, c, k))
            mk.append(maj_at_k([r["answer"] for r in recs], lambda a, right=right: a in right, k))
        out[f"pass@{k}"] = sum(pk) / len(pk)
        out[f"maj@{k}"] = sum(mk) / len(mk)
    return out


def write_records(records: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
