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

import socket
from typing import Callable

import ray

from rlpost.distributed.actors import RemoteTrainer, RolloutWorker, TrainerWorker
from rlpost.distributed.pool import RolloutPool
from rlpost.sections import DistConfig


def threads(dist: DistConfig, cores: int) -> tuple[int, int]:
    """(torch threads of the trainer actor, of each rollout worker) on ``cores`` cores. Disaggregated
    phases take turns, so each gets every core; async ones run at once, so the cores are split."""
    if dist.topology == "async":
        trainer = dist.trainer_threads or max(1, cores // 2 // dist.trainer_ranks)
        return trainer, dist.rollout_threads or max(1, (cores - trainer * dist.trainer_ranks) // dist.rollout_workers)
    return (dist.trainer_threads or max(1, cores // dist.trainer_ranks),
            dist.rollout_threads or max(1, cores // dist.rollout_workers))


def free_port() -> int:
    """A free TCP port for the trainer ranks' process group (they run on this node)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ray(address: str) -> None:
    if not ray.is_initialized():
        ray.init(address=address or None, include_dashboard=False, log_to_driver=True,
                 configure_logging=False)


def place(dist: DistConfig, cores: int, on_gpu: bool, seed: int, sampler_dtype: str, weights: dict | None,
          make_sampler: Callable, make_trainer: Callable, stream=None, rollout_worker: type | None = None,
          say: Callable[[str], None] = print) -> tuple[RolloutPool, RemoteTrainer]:
    """(the rollout pool over dist.rollout_workers actors, the trainer over dist.trainer_ranks
    actors). Each actor builds its role with the factory it is handed (``build.sampler_from`` /
    ``build.trainer_from``, the functions the colocated run uses around its policy), so it samples
    and trains exactly as the single process does. ``cores``: what the actors' threads share;
    ``on_gpu``: each actor asks Ray for one GPU; ``seed``: run.seed (a chunk's samples follow from
    it on any worker); ``sampler_dtype``: rollout.dtype, what the trainer sends weights in.
    ``stream``: the prompt stream an async pool reads ahead from. ``rollout_worker``: the worker's
    class (default ``RolloutWorker``; tests pass one that fails on purpose)."""
    start_ray(dist.ray_address)
    t_threads, r_threads = threads(dist, cores)
    initial = ray.put(weights) if weights is not None else None
    ranks, master = dist.trainer_ranks, f"127.0.0.1:{free_port()}"
    gpus = 1 if on_gpu else 0  # one GPU per actor; never run on one (docs/gpu.md)
    trainer_cls = ray.remote(num_cpus=0, num_gpus=gpus)(TrainerWorker)
    trainer = RemoteTrainer([trainer_cls.remote(make_trainer, initial, t_threads, sampler_dtype, r, ranks, master)
                             for r in range(ranks)])
    worker_cls = ray.remote(num_cpus=0, num_gpus=gpus, max_restarts=0)(rollout_worker or RolloutWorker)
    spawn = lambda i, w: worker_cls.remote(make_sampler, w, r_threads, seed)
    is_async = dist.topology == "async"
    pool = RolloutPool(spawn, dist.rollout_workers, dist.chunk_prompts, dist.max_staleness if is_async else 0,
                       initial_weights=initial, say=say, stream=stream if is_async else None)
    if dist.weight_sync == "broadcast":
        join_broadcast(trainer, pool, gpus > 0)
    say(f"topology {dist.topology}: {dist.rollout_workers} rollout worker(s) x {r_threads} thread(s), "
        f"{ranks} trainer rank(s) x {t_threads}" + (f", max_staleness {dist.max_staleness}" if is_async else "")
        + (", weights by broadcast" if dist.weight_sync == "broadcast" else ""))
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
