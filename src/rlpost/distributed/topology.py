"""Placement by config: where the sampler and the trainer of a disaggregated or async run live.

The loop (recipes/rl.py: train) is the same function for every topology; only what ``Roles`` holds
changes (``build.build_roles`` calls ``place`` here). Here the rollout is a ``RolloutPool`` over
``dist.rollout_workers`` Ray actors and the trainer a ``RemoteTrainer`` over ``dist.trainer_ranks``
actors (FSDP2 data parallel when > 1); the verifier, the reference and the algorithm stay in the
driver (they are light, or a subprocess pool already). Actors ask Ray for no CPUs
(``num_cpus=0``): their torch thread counts are set here, so a 2-core machine can host a trainer and
a worker without Ray holding one of them back. With ``run.device=cuda`` each actor asks for one GPU
(``num_gpus=1``): Ray then shows it only that GPU, which ``cuda`` means inside it (docs/gpu.md).
"""

from __future__ import annotations

import os
import socket
from typing import Callable

import ray

from rlpost import config
from rlpost.distributed.actors import RemoteTrainer, RolloutWorker, TrainerWorker
from rlpost.distributed.pool import RolloutPool
from rlpost.model import device


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
    if not ray.is_initialized():
        ray.init(address=cfg.dist.ray_address or None, include_dashboard=False, log_to_driver=True,
                 configure_logging=False)


def place(cfg: config.Config, weights: dict | None, make_rollout: Callable, make_trainer: Callable, stream=None,
          rollout_worker: type | None = None, say: Callable[[str], None] = print) -> tuple[RolloutPool, RemoteTrainer]:
    """(the rollout pool over dist.rollout_workers actors, the trainer over dist.trainer_ranks
    actors). Each actor builds its role with the factory it is handed (``build.make_rollout`` /
    ``make_trainer``), so it samples and trains exactly as the single process does. ``stream``:
    the prompt stream an async pool reads ahead from. ``rollout_worker``: the worker's class
    (default ``RolloutWorker``; tests pass one that fails on purpose)."""
    start_ray(cfg)
    t_threads, r_threads = threads(cfg)
    initial = ray.put(weights) if weights is not None else None
    ranks, master = cfg.dist.trainer_ranks, f"127.0.0.1:{free_port()}"
    gpus = 1 if device.is_cuda(cfg.run.device) else 0  # one GPU per actor; never run on one (docs/gpu.md)
    trainer_cls = ray.remote(num_cpus=0, num_gpus=gpus)(TrainerWorker)
    trainer = RemoteTrainer([trainer_cls.remote(cfg, initial, t_threads, make_trainer, r, ranks, master) for r in range(ranks)])
    worker_cls = ray.remote(num_cpus=0, num_gpus=gpus, max_restarts=0)(rollout_worker or RolloutWorker)
    spawn = lambda i, w: worker_cls.remote(cfg, w, r_threads, make_rollout)
    d = cfg.dist
    is_async = d.topology == "async"
    pool = RolloutPool(spawn, d.rollout_workers, d.chunk_prompts, d.max_staleness if is_async else 0,
                       initial_weights=initial, say=say, stream=stream if is_async else None)
    if d.weight_sync == "broadcast":
        join_broadcast(trainer, pool, gpus > 0)
    say(f"topology {d.topology}: {d.rollout_workers} rollout worker(s) x {r_threads} thread(s), "
        f"{ranks} trainer rank(s) x {t_threads}" + (f", max_staleness {d.max_staleness}" if is_async else "")
        + (", weights by broadcast" if d.weight_sync == "broadcast" else ""))
    return pool, trainer


def join_broadcast(trainer: RemoteTrainer, pool: RolloutPool, on_gpu: bool) -> None:
    """dist.weight_sync=broadcast: trainer rank 0 (member 0) and every rollout worker form one
    group at an address rank 0 picks, told once what each push carries (distributed/sync.py)."""
    addr = ray.get(trainer.handles[0].sync_address.remote())
    sp = ray.get([h.weight_spec.remote() for h in trainer.handles])[0]
    world = 1 + len(pool.workers)
    ray.get([h.join_sync.remote(addr, world) for h in trainer.handles]
            + [w.join_sync.remote(addr, i + 1, world, sp, on_gpu) for i, w in enumerate(pool.workers)])
    trainer.broadcast = pool.broadcast = True
