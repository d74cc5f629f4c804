"""Placement by config: build the roles of a disaggregated or async run.

The loop (controller.train) is the same function for every topology; only what ``Roles`` holds
changes. Here the rollout is a ``RolloutPool`` over ``dist.rollout_workers`` Ray actors and the
trainer a ``RemoteTrainer`` over ``dist.trainer_ranks`` actors (FSDP2 data parallel when > 1); the verifier, the reference and the algorithm stay in
the driver (they are light, or a subprocess pool already). Actors ask Ray for no CPUs
(``num_cpus=0``): their torch thread counts are set here, so a 2-core machine can host a trainer and
a worker without Ray holding one of them back.
"""

from __future__ import annotations

import os
import socket

from rlpost import algorithms, config
from rlpost.distributed.actors import RemoteTrainer, RolloutWorker, TrainerWorker
from rlpost.distributed.pool import RolloutPool
from rlpost.envs import stack, verifier_timeout
from rlpost.envs.runner import VerifierRunner
from rlpost.models import load_policy

# Tests set this to make a rollout worker fail on one chunk (actors.RolloutWorker._fault_hook).
FAULT_ENV = "RLPOST_KILL_ROLLOUT_CHUNK"


def threads(cfg: config.Config) -> tuple[int, int]:
    """(torch threads of the trainer actor, of each rollout worker). Disaggregated phases take
    turns, so each gets every core; async ones run at once, so the cores are split."""
    d, cores = cfg.dist, cfg.run.threads or os.cpu_count()
    if d.topology == "async":
        trainer = d.trainer_threads or max(1, cores // 2 // d.trainer_ranks)
        return trainer, d.rollout_threads or max(1, (cores - trainer * d.trainer_ranks) // d.rollout_workers)
    return d.trainer_threads or max(1, cores // d.trainer_ranks), d.rollout_threads or max(1, cores // d.rollout_workers)


def free_port() -> int:
    """A free TCP port for the trainer ranks' process group (they run on this node)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ray(cfg: config.Config) -> None:
    import ray

    if not ray.is_initialized():
        ray.init(address=cfg.dist.ray_address or None, include_dashboard=False, log_to_driver=True,
                 configure_logging=False)


def build_remote_roles(cfg: config.Config, verifier_path: str, weights: dict | None = None):
    import ray

    from rlpost.roles.controller import Roles, make_reference, needs_reference, say

    start_ray(cfg)
    t_threads, r_threads = threads(cfg)
    initial = ray.put(weights) if weights is not None else None
    ranks, master = cfg.dist.trainer_ranks, f"127.0.0.1:{free_port()}"
    trainer_cls = ray.remote(num_cpus=0)(TrainerWorker)
    trainer = RemoteTrainer([trainer_cls.remote(cfg, initial, t_threads, r, ranks, master) for r in range(ranks)])
    worker_cls = ray.remote(num_cpus=0, max_restarts=0)(RolloutWorker)
    fault = os.environ.get(FAULT_ENV, "")
    spawn = lambda i, w: worker_cls.remote(cfg, w, r_threads, fault)
    d = cfg.dist
    pool = RolloutPool(spawn, d.rollout_workers, d.chunk_prompts, d.max_staleness if d.topology == "async" else 0,
                       initial_weights=initial, say=say)
    algo = algorithms.build(cfg)
    # The reference is the starting policy, so a fresh load is it (checkpoint weights never go in).
    reference = make_reference(cfg, load_policy(cfg.model.name, seed=cfg.run.seed).model) if needs_reference(cfg, algo) else None
    verifier = VerifierRunner(verifier_path, verifier_timeout(cfg))
    reward = stack.build_reward(cfg, verifier, config.derived(cfg).micro_batch_size)
    say(f"topology {d.topology}: {d.rollout_workers} rollout worker(s) x {r_threads} thread(s), "
        f"{ranks} trainer rank(s) x {t_threads}" + (f", max_staleness {d.max_staleness}" if d.topology == "async" else ""))
    return Roles(pool, reward, reference, algo, trainer, grader=verifier)
