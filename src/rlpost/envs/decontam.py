"""Decontamination: how many held-out (or eval) prompts the training prompts already contain.

Word n-gram overlap, the check Tülu 3 runs between its training and evaluation sets (Lambert et al.
2024, arXiv:2411.15124: 8-gram matching, an example counted as contaminated when most of it
overlaps). Here, for each held-out prompt, the largest share of its lower-cased, whitespace-split
8-grams that one training prompt contains; at least ``threshold`` makes it contaminated. One
prompt, not the union of all: every gram of a templated prompt occurs somewhere in a large training
set. A prompt shorter than 8 words is one gram, so short prompts are compared whole.

Templates are not contamination. A task's fixed wording ("Give the answer as a fraction in lowest
terms", a system prompt) would otherwise make every prompt overlap every other, so an n-gram that
occurs in more than ``BOILERPLATE`` of the held-out prompts, or of the training prompts (each
side counted from 10 prompts on), is left out of the count, and a prompt with nothing left is not
counted. A training prompt copied into the held-out set still has its own grams, unless it is
copied into more than a tenth of the training set. ``rlpost eval`` reports the result; training refuses to start above
``task.max_contamination`` (envs/__init__.py: build_task).
"""

from __future__ import annotations

from collections import Counter

N = 8  # words per gram
BOILERPLATE = 0.1  # an n-gram in more than this share of the held-out prompts is template text


def prompt_text(row: dict) -> str:
    """The text the model is shown: every message but the assistant's."""
    return " ".join(str(m.get("content", "")) for m in row.get("messages", []) if m.get("role") != "assistant")


def ngrams(text: str, n: int = N) -> set[tuple[str, ...]]:
    words = text.lower().split()
    return {tuple(words[i : i + n]) for i in range(max(1, len(words) - n + 1))} if words else set()


def _frequent(prompts: list[set]) -> set:
    """The n-grams in more than BOILERPLATE of these prompts (none below 10 prompts: too few to tell)."""
    seen = Counter(g for grams in prompts for g in grams)  # in how many prompts each gram occurs
    return {g for g, c in seen.items() if len(prompts) >= 10 and c > BOILERPLATE * len(prompts)}


def contamination(train: list[dict], heldout: list[dict], threshold: float = 0.5, n: int = N) -> dict:
    """Metrics: contamination_checked (held-out prompts with grams beyond the template), contamination_contaminated,
    contamination_contaminated_frac, and up to three contaminated prompts as contamination_examples."""
    held = [ngrams(prompt_text(r), n) for r in heldout]
    trained = [ngrams(prompt_text(r), n) for r in train]
    template = _frequent(held) | _frequent(trained)
    rows_with: dict[tuple[str, ...], list[int]] = {}  # gram -> the training prompts that contain it
    for i, grams in enumerate(trained):
        for g in grams - template:
            rows_with.setdefault(g, []).append(i)
    checked, hits = 0, []
    for row, grams in zip(heldout, held):
        own = grams - template
        if not own:
            continue
        checked += 1
        shared = Counter(i for g in own for i in rows_with.get(g, ()))  # training prompt -> grams in common
        if shared and max(shared.values()) >= threshold * len(own):
            hits.append(prompt_text(row))
    return {"contamination_checked": checked, "contamination_contaminated": len(hits),
            "contamination_contaminated_frac": len(hits) / checked if checked else 0.0,
            "contamination_examples": hits[:3]}


def overlapping(train: list[dict], heldout: list[dict], threshold: float = 0.5, n: int = N) -> dict[int, int]:
    """The training rows that contain a held-out prompt, by the rule of ``contamination`` seen from the
    other side: training row -> the first held-out row at least ``threshold`` of whose own (non-template)
    grams it contains. ``rlpost curate`` drops these from the training data (recipes/curate.py)."""
    held = [ngrams(prompt_text(r), n) for r in heldout]
    trained = [ngrams(prompt_text(r), n) for r in train]
    template = _frequent(held) | _frequent(trained)
    own = [grams - template for grams in held]
    rows_with: dict[tuple[str, ...], list[int]] = {}  # gram -> the held-out prompts that have it as their own
    for j, grams in enumerate(own):
        for g in grams:
            rows_with.setdefault(g, []).append(j)
    found: dict[int, int] = {}
    for i, grams in enumerate(trained):
        shared = Counter(j for g in grams for j in rows_with.get(g, ()))  # held-out prompt -> grams in common
        hits = [j for j, c in shared.items() if c >= threshold * len(own[j])]
        if hits:
            found[i] = min(hits)
    return found
