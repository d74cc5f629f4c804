"""The OpenAI endpoint's overhead per model call: the same guess-the-number task as an in-process
environment (task.name=env task.env=guess: roles/rollout_env.py) and as the agent of
docs/environments.md against the endpoint (task.name=agent: roles/rollout_agent.py), on one sampler.

    .venv/bin/python benchmarks/agent_overhead.py                    # embedded model, 3 reps
    .venv/bin/python benchmarks/agent_overhead.py --model tiny --reps 5
    .venv/bin/python benchmarks/agent_overhead.py --threads 2          # on a quiet machine

Each rep runs the arms on the same 16 rows (a game each, 4 turns of <= 8 tokens at T = 0.7), the arms
alternating, after one warm-up generate each (worker start-up, imports and the packed weights are not
counted). The agent runs three times a rep on the same endpoint: as before requests could join a
running decode, one decode at a time (``Endpoint.admit = False``: a request arriving during a decode
waits for it to end); joining the running decode at the next step (the endpoint's default,
roles/endpoint.py); and joining it once the oldest waiting request has waited 50 ms
(``Endpoint.JOIN_S``), so that agents' calls join together.
Per arm: wall seconds of one generate, model calls (turns) made, decodes, and seconds per call. The
arms draw different samples (the agent's calls meet in other batches), so turn counts differ a little:
seconds per call is the comparison. Overhead per call = the arm's - environment's.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from rlpost.envs.agents import AgentPool
from rlpost.envs.guess import GuessNumber
from rlpost.envs.pool import EnvPool
from rlpost.model import precision
from rlpost.model.load import load_policy
from rlpost.roles.endpoint import Endpoint, Limits
from rlpost.roles.engine import build_rollout
from rlpost.roles.rollout_agent import AgentRollout
from rlpost.roles.rollout_env import EnvRollout

ROOT = Path(__file__).resolve().parents[1]


def docs_agent(folder: Path) -> str:
    """docs/environments.md's agent, written to a module in ``folder``; its import path."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "environments.md").read_text(), re.S)
    (agent,) = [b for b in blocks if "def play(client: OpenAI, row: dict)" in b]
    (folder / "docs_agent.py").write_text(agent)
    return "docs_agent:play"


def run(arm, rows: list[dict], admit: bool = True, join_s: float = 0.0) -> dict:
    if hasattr(arm, "endpoint"):
        arm.endpoint.admit, arm.endpoint.JOIN_S = admit, join_s
    t0 = time.perf_counter()
    batch = arm.generate(rows, 1, 0.7, 1.0, 8)
    wall = time.perf_counter() - t0
    calls = sum(e["turns"] for e in batch.episodes)
    decodes = arm.last_metrics.get("env/decode_calls", arm.last_metrics.get("agent/decode_calls"))
    errors = sum(bool(e.get("error")) for e in batch.episodes)
    return {"wall_s": wall, "calls": calls, "decodes": decodes, "s_per_call": wall / max(1, calls), "errors": errors}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: no spinning against a loaded machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    loaded = load_policy(args.model)
    engine = build_rollout("auto", loaded.model, loaded.tokenizer, precision.sampler_dtype("auto"))
    rows = GuessNumber().rows("train", args.rows, 0)
    with tempfile.TemporaryDirectory() as tmp:
        env = EnvRollout(engine, EnvPool("rlpost.envs.guess:GuessNumber", {}, 30.0, workers=2), 4, 128)
        pool = AgentPool(docs_agent(Path(tmp)), "", 120.0, workers=args.rows, import_paths=(tmp,))
        agent = AgentRollout(engine, pool, Endpoint(engine, Limits(8, context=0, max_calls=4, max_episode_tokens=128)))
        try:
            for arm in (env, agent):
                run(arm, rows)  # warm-up: workers started, imports done, weights packed
            arms = {"environment": (env, True, 0.0), "agent, a decode at a time": (agent, False, 0.0),
                    "agent, joining at once": (agent, True, 0.0),
                    "agent, joining after 50 ms": (agent, True, 0.05)}
            got: dict[str, list[dict]] = {name: [] for name in arms}
            for _ in range(args.reps):
                for name, (arm, admit, join_s) in arms.items():
                    got[name].append(run(arm, rows, admit, join_s))
        finally:
            env.pool.close()
            agent.pool.close()
            agent.endpoint.stop()
    print(f"model {args.model}, {args.rows} games a rep, {args.reps} reps, torch threads {torch.get_num_threads()}")
    print("| arm | wall s per generate (median) | model calls | decodes | s per call (median) | errors |")
    print("|---|---|---|---|---|---|")
    med = {}
    for name, reps in got.items():
        med[name] = statistics.median(r["s_per_call"] for r in reps)
        print(f"| {name} | {statistics.median(r['wall_s'] for r in reps):.2f} | "
              f"{', '.join(str(r['calls']) for r in reps)} | {', '.join(str(r['decodes']) for r in reps)} | "
              f"{med[name] * 1000:.1f} ms | {sum(r['errors'] for r in reps)} |")
    for name in list(got)[1:]:
        print(f"overhead per call, {name}: {(med[name] - med['environment']) * 1000:+.1f} ms "
              f"({med[name] / med['environment']:.2f}x the environment's time per call)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
