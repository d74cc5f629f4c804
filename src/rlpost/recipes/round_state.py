"""Where a run in rounds stands (rsft, online DPO: recipes/online.py), so that one cut short goes on.

A round samples from the current policy, writes the rows it kept to ``round_N/``, trains one pass on
them there (recipes/offline.py: that folder has its own checkpoints) and measures the held-out
accuracy. ``RUN/rounds.json`` is written whole or not at all, twice a round:

  after its samples   ``pending``: the round whose rows are on disk, with the sampling's metrics
  after the round     ``done``: its number, the rounds' records, the policy it left

Each time with the prompt-drawing RNG's state before the next round's draw (``rng``, Python's
``random.Random.getstate()`` as JSON: a pending round's rows that went missing are drawn again as they
were), and ``model``, the policy the next round samples from (relative to RUN when inside it: the run
folder moves whole). The torch seed of round N's sampling is ``run.seed + N`` whatever came before, so
a resume samples what the uninterrupted run would have. What a resume does with each point is
``sampled_rounds``'s; this module reads and checks the file without torch, for the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlpost.observe.runfolder import ROUNDS as STATE
from rlpost.types.errors import DataError
from rlpost.types.schema import ListOf, MapOf, Where, check

NUMBERS = MapOf((int, float, type(None)))
RNG = Where(lambda s: len(s) == 3 and s[0] == 3 and len(s[1]) == 625 and all(isinstance(x, int) for x in s[1])
            and s[2] is None, "random.Random's state (3, 625 integers, null)")
SCHEMA = {"kind": str, "done": Where(lambda n: isinstance(n, int) and not isinstance(n, bool) and n >= 0,
                                     "an integer >= 0"),
          "model": str, "rounds": ListOf(dict), "rng": RNG,
          "pending?": {"round": int, "metrics": NUMBERS}}


def text(kind: str, done: int, model: str, rounds: list[dict], rng_state: tuple, run_dir: Path,
         pending: dict | None = None) -> str:
    """The file's text (the caller writes it atomically)."""
    try:
        model = str(Path(model).resolve().relative_to(run_dir.resolve()))
    except ValueError:
        pass  # outside the run folder (the model it started from): as given
    state = {"kind": kind, "done": done, "model": model, "rounds": rounds, "rng": rng_state}
    if pending is not None:
        state["pending"] = pending
    return json.dumps(state)


def read(run_dir: Path, kind: str | None = None) -> dict | None:
    """The state of ``run_dir`` (None when it has none: stopped before its first round's base measure),
    checked: a damaged file or one of another kind of run is one line naming it (DataError). ``model``
    comes back as a path to load, ``rng`` as ``random.Random.setstate`` takes it."""
    path = Path(run_dir) / STATE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise DataError(f"{path}: not readable JSON ({type(e).__name__}); --start-over trains the run again from "
                        "its first round") from None
    again = "; --start-over trains the run again from its first round"
    try:
        check(state, SCHEMA, str(path))
    except DataError as e:
        raise DataError(f"{e}{again}") from None
    if kind is not None and state["kind"] != kind:
        raise DataError(f"{path}: kind: the state of an {state['kind']} run, not of {kind}{again}")
    if state["rounds"][-1:] and state["rounds"][-1].get("round") != state["done"]:
        raise DataError(f"{path}: done: {state['done']}, but its last round record is of round "
                        f"{state['rounds'][-1].get('round')}{again}")
    model = Path(state["model"])
    if not model.is_absolute() and (Path(run_dir) / model).exists():
        state["model"] = str(Path(run_dir) / model)
    version, internal, gauss = state["rng"]
    state["rng"] = (version, tuple(internal), gauss)
    return state


def point(state: dict) -> str:
    """Where a resume goes on from, in words: 'the end of round 2', with a sampled round's rows kept."""
    out = f"the end of round {state['done']}" if state["done"] else "round 1 (the base model measured)"
    if "pending" in state:
        out += f" (round {state['pending']['round']}'s samples kept)"
    return out
