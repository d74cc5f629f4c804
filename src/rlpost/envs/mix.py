"""Several task families in one run (``task.mix``): the mixed prompt stream, the verifier that
scores each row by its own family's rules, and the per-family batch metrics.

verl trains on several datasets by listing their files (``data.train_files``, concatenated in
``verl/utils/dataset/rl_dataset.py``); each row's ``data_source`` picks its reward function
(``verl/utils/reward_score/__init__.py: default_compute_score``) and names its validation metrics
(``val-core/<data_source>/...``). Multi-domain RLVR mixes task families the same way: Tülu 3's
RLVR over GSM8K, MATH and instruction-following constraints (Lambert et al. 2024,
arXiv:2411.15124), DeepSeek-R1's reasoning RL over math, code, science and logic (arXiv:2501.12948).
Here each row of a mix carries its family in ``row["task_family"]`` (stamped by build_task;
``data_source`` stays the user's, for verl-style reward functions), and the mix has weights: the
family of every training prompt is drawn with them, rather than in proportion to row counts.

The draw is a pure function of (run.seed, the prompt's index in the stream), so the stream's state
is the number of prompts drawn plus each family's own PromptStream state (epoch, position,
curriculum record): a resumed run draws exactly what the uninterrupted run would have drawn.

The verifier ``score`` runs in the verifier worker processes like any family's (rewards/runner.py):
same deadline (task.verifier_timeout_s, or the longest default of the mixed families), CPU and
memory limits; it imports the family's verifier there on first use. Code rows carry their sandbox
settings (code.prepare stamps them), so the sandbox is the same as in a code-only run.
"""

from __future__ import annotations

import bisect
import functools
import importlib
import itertools
import random

from rlpost.envs import DEFAULT_VERIFIER, TASK_KEY, Task
from rlpost.envs.data import PromptStream
from rlpost.types.schema import Where, check


def score(completion: str, row: dict) -> tuple[float, dict]:
    """The verifier of a mix: the reward and info of the row's own family's verifier
    (DEFAULT_VERIFIER[row["task_family"]]). A row of no mixable family is a verifier error."""
    family = row.get(TASK_KEY)
    if family not in DEFAULT_VERIFIER or family == "tools":
        raise ValueError(f"row[{TASK_KEY!r}] is {family!r}: expected the family of a task.mix row")
    return _verifier(family)(completion, row)


@functools.cache
def _verifier(family: str):
    """The family's verifier function, imported once per worker process."""
    module, _, name = DEFAULT_VERIFIER[family].partition(":")
    return getattr(importlib.import_module(module), name)


class MixedStream:
    """Training prompts of several families, ``batch_size`` at a time: the family of the stream's
    i-th prompt is drawn with the mix's weights by a generator seeded with (seed, i), the prompt itself is the
    next of that family's own PromptStream (its shuffle per epoch, its curriculum). Same verbs as
    PromptStream, so the loop, the async pool (``peek``) and checkpoints use either."""

    def __init__(self, rows_by_family: dict[str, list[dict]], weights: dict[str, float], batch_size: int, seed: int,
                 curriculum: tuple[int, float, float] | None = None):
        self.families = list(rows_by_family)
        total = sum(weights[f] for f in self.families)
        self.cdf = list(itertools.accumulate(weights[f] / total for f in self.families))  # (n_families,) ends at 1
        self.streams = {f: PromptStream(rows, batch_size, seed, curriculum) for f, rows in rows_by_family.items()}
        self.batch_size, self.seed, self.drawn = batch_size, seed, 0

    def family(self, i: int) -> str:
        """The family of the stream's i-th prompt: inverse CDF of one uniform draw seeded by (seed, i)."""
        u = random.Random(f"mix:{self.seed}:{i}").random()  # a str seed hashes with SHA-512: the same in every process
        # min: cdf[-1] may round below 1
        return self.families[min(bisect.bisect_right(self.cdf, u), len(self.families) - 1)]

    def next(self) -> list[dict]:
        drawn = [self.family(self.drawn + j) for j in range(self.batch_size)]
        self.drawn += self.batch_size
        rows = {f: iter(self.streams[f].next(drawn.count(f))) for f in dict.fromkeys(drawn)}
        return [next(rows[f]) for f in drawn]  # in the order drawn

    @property
    def epoch(self) -> int:
        """Epochs every family has completed (training/epoch)."""
        return min(s.epoch for s in self.streams.values())

    def observe(self, rows: list[dict], pass_rates: list[float]) -> dict:
        """Each prompt's pass rate to its family's curriculum; their metrics added up."""
        out: dict = {}
        for f, stream in self.streams.items():
            mine = [(r, p) for r, p in zip(rows, pass_rates) if r[TASK_KEY] == f]
            for k, v in stream.observe([r for r, _ in mine], [p for _, p in mine]).items():
                out[k] = out.get(k, 0) + v
        return out

    def fork(self) -> MixedStream:
        """A copy at the same position that moves on its own."""
        probe = MixedStream.__new__(MixedStream)
        probe.__dict__.update(self.__dict__)
        probe.streams = {f: s.fork() for f, s in self.streams.items()}
        return probe

    def peek(self, ahead: int = 0) -> list[dict]:
        """The batch ``next()`` will return after ``ahead`` more calls, without moving the stream."""
        probe = self.fork()
        for _ in range(ahead):
            probe.next()
        return probe.next()

    def state_dict(self) -> dict:
        return {"drawn": self.drawn, "streams": {f: s.state_dict() for f, s in self.streams.items()}}

    def load_state_dict(self, state: dict) -> None:
        check(state, {"drawn": Where(lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                                     "a whole number >= 0"), "streams": {f: dict for f in self.streams}},
              "state.pt: stream")
        self.drawn = state["drawn"]
        for f, s in self.streams.items():
            s.load_state_dict(state["streams"][f])


def make_stream(task: Task, batch_size: int, seed: int, curriculum: tuple[int, float, float] | None = None):
    """The loop's prompt stream: a PromptStream over the task's training rows, or for a mix a
    MixedStream over each family's."""
    if not task.mix:
        return PromptStream(task.train, batch_size, seed, curriculum)
    by_family = {f: [r for r in task.train if r[TASK_KEY] == f] for f in task.mix}
    return MixedStream(by_family, task.mix, batch_size, seed, curriculum)


def source_of(row: dict) -> str | None:
    """What a row's metrics are grouped by: its family in a mix, else verl's data_source when the rows
    carry one (verl logs val-core/<data_source>/...), else nothing."""
    if TASK_KEY in row:
        return row[TASK_KEY]
    source = row.get("data_source")
    return str(source) if source not in (None, "") else None


def batch_metrics(rows: list[dict], rewards: list[float]) -> dict:
    """Per family of a mixed batch, or per data_source of a dataset's (one row and reward per
    completion): reward/mean/<family>, reward/pass_rate/<family> (share of its completions with
    reward >= 1, as core.pass_rate) and mix/share/<family> (its share of the batch). Only the
    families in the batch; {} when the rows name none."""
    by_family: dict[str, list[float]] = {}
    for row, r in zip(rows, rewards):
        if source_of(row) is not None:
            by_family.setdefault(source_of(row), []).append(r)
    out = {}
    for f, rs in by_family.items():
        out[f"reward/mean/{f}"] = sum(rs) / len(rs)
        out[f"reward/pass_rate/{f}"] = sum(r >= 1.0 for r in rs) / len(rs)
        out[f"mix/share/{f}"] = len(rs) / len(rows)
    return out
