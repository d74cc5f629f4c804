"""reasoning-gym adaptor: any of its ~100 procedural datasets becomes a task (training rows,
held-out rows) scored by that dataset's own ``score_answer``.

Why its own scorer: many reasoning-gym tasks have several right answers (a valid path, a valid
colouring, an equivalent expression) or partial credit, so comparing strings with
``entry["answer"]`` would be wrong; ``score_answer(answer, entry)`` encodes the task's rule.

Splits. reasoning-gym seeds entry i of a dataset with ``Random(seed + i)``, so datasets built
with seeds s and s+1 share all but one entry. The held-out split therefore uses the seed
``seed + HELDOUT_SEED_OFFSET`` (far from any training index), keeps distinct questions, and
every training entry whose question also appears in it is dropped. A few datasets iterate
Python sets when generating (isomorphic_strings, polynomial_multiplication, ransom_note), so
their questions are fixed by the seed only under a fixed PYTHONHASHSEED.

Rows are JSON-safe (metadata sets become lists, tuples lists, other objects strings) so they
can be written to .jsonl and read back. Some scorers compare metadata by type (ARC grids are
tuples of tuples), so ``_RESTORE`` turns those fields back before scoring, and build_splits
checks on the first rows that the JSON-safe entry scores its own gold answer exactly like the
original entry, failing loudly for a dataset that needs a new restore rule.

Answers. Prompts use reasoning-gym's "default" system prompt (what its eval/eval.py sends),
which asks for the final answer in <answer> tags; ``score`` reads the last <answer> block with
``reasoning_gym.utils.extract_answer``. Without tags, ``score`` falls back to the whole
stripped completion, the way reasoning-gym's README calls ``score_fn(model_response, entry)``;
``score_strict`` scores it as no answer (None), as its eval/eval.py does. Note that many scorers
give partial credit len(gold)/len(answer) when the gold is a substring of the answer, so the
fallback pays a little for a long untagged completion that contains the answer.

Three upstream scorers (reasoning-gym 0.1.25) pay full reward for wrong answers, found by
probing every dataset with junk answers: game_of_life_halting (any non-empty answer),
puzzle24 (any four numbers making 24, not the puzzle's) and coin_flip ("0" for any probability
below 0.1). ``_FIXES`` closes each hole and keeps the rest of the rule. A scorer that raises on
a malformed answer (prime_factorization on "abc") scores 0 with ``scorer_error`` in info, so
a model's junk does not count as a verifier failure.

Datasets whose ``entry["answer"]`` is None have no single gold answer (boxnet, graph_color,
propositional_logic, rubiks_cube, rush_hour): their scorer checks the answer itself.

Light at import: reasoning_gym (about 1 s to import) is imported on first use, and scorer
objects are built once per (name, config) per process with size=1 -- scorers read the entry
plus the dataset's config, never its generated items, but several read the config
(decimal_arithmetic, time_intervals, arc_agi's board format), so the config must match.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json

HELDOUT_SEED_OFFSET = 10**9  # held-out entries come from seeds seed+1e9 ... (see docstring)
MAX_SEED = 2**31  # seed + offset + size must stay < 2**32: some generators call np.random.seed
ROUND_TRIP_CHECKS = 8  # rows per split whose JSON-safe entry is checked against the original
RESERVED_KEYS = ("seed", "size")  # set by build_splits' arguments, not by the config dict


def build_splits(name: str, config: dict | None, n_train: int, n_heldout: int, seed: int,
                 system_prompt: str | None = "default") -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows) for reasoning-gym dataset ``name`` with keyword ``config``.

    ``system_prompt``: a key of ``reasoning_gym.utils.SYSTEM_PROMPTS`` ("default",
    "DeepSeekZero", "simple", "direct", "chain_of_draft"), any other text used as is, or None
    for no system message. Raises ValueError for an unknown name or config key, or when the
    dataset cannot produce enough questions."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    config = dict(config or {})
    check_config(name, config)
    if not 0 <= seed < MAX_SEED:
        raise ValueError(f"seed must be in [0, 2**31), got {seed}")
    heldout = _draw(name, config, seed + HELDOUT_SEED_OFFSET, n_heldout, exclude=set(), distinct=True)
    train = _draw(name, config, seed, n_train, exclude={e["question"] for e in heldout}, distinct=False)
    system = SYSTEM_PROMPTS.get(system_prompt, system_prompt) if system_prompt else None
    splits = []
    for entries in (train, heldout):
        rows = [_row(name, config, e, system) for e in entries]
        _check_round_trip(name, config, entries[:ROUND_TRIP_CHECKS], rows[:ROUND_TRIP_CHECKS])
        splits.append(rows)
    return splits[0], splits[1]


def score(completion: str, row: dict) -> tuple[float, dict]:
    """The dataset's own score for the last <answer> block (or, without tags, the whole stripped
    completion). info: ``extracted`` (the answer scored), ``score``, ``tagged``."""
    return _score(completion, row, fallback=True)


def score_strict(completion: str, row: dict) -> tuple[float, dict]:
    """As ``score``, but an untagged completion is scored as no answer (reasoning-gym's eval)."""
    return _score(completion, row, fallback=False)


def _score(completion: str, row: dict, fallback: bool) -> tuple[float, dict]:
    from reasoning_gym.utils import extract_answer

    gym = row["gym"]
    extracted = extract_answer(completion)  # last <answer>...</answer>, stripped; None if absent
    tagged = extracted is not None
    if not tagged and fallback:
        extracted = completion.strip()
    scorer = _scorer(gym["name"], _config_key(gym["config"]))
    entry = _restore(gym["entry"])
    info = {"extracted": extracted, "tagged": tagged}
    try:
        fix = _FIXES.get(entry.get("metadata", {}).get("source_dataset"))
        # float(): some scorers return int 0 or a numpy float, which would leak into the info dict.
        value = float(fix(scorer, extracted, entry) if fix else scorer.score_answer(extracted, entry))
    except Exception as e:  # noqa: BLE001 - a scorer that chokes on a malformed answer scores 0
        value, info["scorer_error"] = 0.0, f"{type(e).__name__}: {e}"
    return value, {**info, "score": value}


# --- names and configs ----------------------------------------------------------------------


def check_config(name: str, config: dict) -> None:
    """ValueError naming the bad dataset name (with suggestions) or the bad config key."""
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        close = difflib.get_close_matches(name, DATASETS, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
        examples = ", ".join(sorted(DATASETS)[:: max(1, len(DATASETS) // 6)][:6])
        raise ValueError(f"unknown reasoning-gym dataset {name!r}; {hint}"
                         f"{len(DATASETS)} are registered, e.g. {examples}")
    keys = [f.name for f in dataclasses.fields(DATASETS[name][1]) if f.init and f.name not in RESERVED_KEYS]
    for key in config:
        if key in RESERVED_KEYS:
            raise ValueError(f"reasoning-gym {name!r}: config key {key!r} is set by build_splits "
                             f"(seed / n_train / n_heldout), leave it out of the config")
        if key not in keys:
            raise ValueError(f"reasoning-gym {name!r} has no config key {key!r}; its keys are: {', '.join(keys)}")


def _create(name: str, config: dict, size: int, seed: int):
    """reasoning_gym.create_dataset with config errors turned into ValueError."""
    import reasoning_gym

    kwargs = dict(config)
    if name == "composite" and "datasets" in kwargs:  # JSON-safe specs -> DatasetSpec objects
        from reasoning_gym.composite import DatasetSpec

        kwargs["datasets"] = [s if isinstance(s, DatasetSpec) else DatasetSpec(**s) for s in kwargs["datasets"]]
    try:
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **kwargs)
    except (AssertionError, TypeError) as e:  # config.validate() asserts; bad nested specs TypeError
        raise ValueError(f"reasoning-gym rejected the config {config} for {name!r}: {e}") from None


def _config_key(config: dict) -> str:
    """Hashable cache key for a config (dicts are not hashable; sorted JSON is canonical)."""
    return json.dumps(config, sort_keys=True)


@functools.lru_cache(maxsize=64)
def _scorer(name: str, config_key: str):
    """One dataset object per (name, config) per process, used only for score_answer. size=1:
    building the generator is the expensive part (ARC loads its task files, ~0.3 s), the items
    are never generated."""
    return _create(name, json.loads(config_key), size=1, seed=0)


# --- drawing entries and making rows ---------------------------------------------------------


def _draw(name: str, config: dict, seed: int, n: int, exclude: set, distinct: bool) -> list[dict]:
    """The first n entries whose question is not in ``exclude`` (and, if ``distinct``, not seen
    before). Entries are generated lazily, so the generous size costs nothing unless used."""
    size = 4 * n + 16
    ds = _create(name, config, size=size, seed=seed)
    out, seen = [], set()
    for i in range(size):
        if len(out) == n:
            break
        entry = ds[i]
        q = entry["question"]
        if q in exclude or (distinct and q in seen):
            continue
        seen.add(q)
        out.append(entry)
    if len(out) < n:
        kind = "distinct held-out" if distinct else "training (not held-out)"
        raise ValueError(f"reasoning-gym {name!r} with config {config} gave only {len(out)} {kind} questions "
                         f"in {size} draws, {n} wanted; lower the count or widen the config")
    return out


def _row(name: str, config: dict, entry: dict, system: str | None) -> dict:
    user = {"role": "user", "content": entry["question"]}
    messages = ([{"role": "system", "content": system}] if system else []) + [user]
    return {"messages": messages, "answer": entry["answer"],
            "gym": {"name": name, "config": config, "entry": json_safe(entry)}}


def json_safe(obj):
    """A copy made only of dict/list/str/int/float/bool/None (tuples become lists)."""
    return json.loads(json.dumps(obj, default=_plain))


def _plain(obj):
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)  # sorted: set order varies between processes
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        return obj.tolist()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return str(obj)


def _tuple_grid(grid):
    return tuple(tuple(r) for r in grid)


# source_dataset -> {metadata field: JSON value -> the type its scorer compares against}.
# ARC scorers test parse_board(answer) == metadata["output"], a tuple of tuples; a list of lists
# never equals it, and the gold answer would score 0.05 instead of 1.
_RESTORE = {
    "arc_agi": {"input": _tuple_grid, "output": _tuple_grid},
    "rearc": {"input": _tuple_grid, "output": _tuple_grid},
}


def _restore(entry: dict) -> dict:
    """Undo the JSON-safe conversion where a scorer depends on the original types."""
    meta = entry.get("metadata") or {}
    fixes = _RESTORE.get(meta.get("source_dataset"))
    if not fixes:
        return entry
    meta = {k: (fixes[k](v) if k in fixes else v) for k, v in meta.items()}
    return {**entry, "metadata": meta}


# --- upstream scorers with reward holes (reasoning-gym 0.1.25), found by probing every dataset
# with junk answers. Each fix keeps the dataset's rule and closes one hole. ---------------------


def _fix_game_of_life_halting(scorer, answer, entry) -> float:
    # Upstream tests bool(answer) == bool(gold): every non-empty string is True, so "False",
    # "zzz" and the right answer all score 1.0. Compare the words instead.
    return float(answer is not None and answer.strip().lower() == str(entry["answer"]).strip().lower())


def _fix_puzzle24(scorer, answer, entry) -> float:
    # Upstream checks that the expression makes 24 with four numbers in range, not that they are
    # this puzzle's numbers: "1*2*3*4" solves every puzzle. Require the puzzle's numbers too.
    import re

    used = sorted(int(n) for n in re.findall(r"\b\d+\b", answer or ""))
    if used != sorted(entry["metadata"]["numbers"]):
        return 0.01  # upstream's score for any wrong expression
    return scorer.score_answer(answer, entry)


def _fix_coin_flip(scorer, answer, entry) -> float:
    # Upstream gives partial credit for a matching prefix divided by the SHORTER string, so "0"
    # scores 1.0 against any probability below 0.1 ("0.2" against "0.25" too). Keep upstream's
    # tolerance (1e-4) for full credit and drop the prefix credit.
    from fractions import Fraction

    try:
        diff = abs(float(Fraction(answer.replace(",", ""))) - float(Fraction(entry["answer"].replace(",", ""))))
    except (AttributeError, ValueError, ZeroDivisionError):
        return 0.0
    return float(diff <= 1e-4)


_FIXES = {"game_of_life_halting": _fix_game_of_life_halting, "puzzle24": _fix_puzzle24, "coin_flip": _fix_coin_flip}


def _check_round_trip(name: str, config: dict, entries: list[dict], rows: list[dict]) -> None:
    """The JSON-safe entry must score the gold answer exactly as the original entry does."""
    scorer = _scorer(name, _config_key(config))
    for entry, row in zip(entries, rows):
        if entry["answer"] is None:  # no single gold answer to test with
            continue
        want = scorer.score_answer(entry["answer"], entry)
        got = scorer.score_answer(entry["answer"], _restore(row["gym"]["entry"]))
        if got != want:
            raise ValueError(f"reasoning-gym {name!r}: after JSON conversion the gold answer scores {got} "
                             f"instead of {want}; add a rule for it to rlpost.envs.gym._RESTORE")
