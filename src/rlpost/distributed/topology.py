"""Placement by config: where the sampler and the trainer of a disaggregated or async run live.

The loop (recipes/rl.py: train) is the same function for every topology; only what ``Roles`` holds
changes (``build.build_roles`` calls ``place`` here). Here the rollout is a ``RolloutPool`` over
``dist.rollout_workers`` Ray actors and the trainer a ``RemoteTrainer`` over ``dist.trainer_ranks``
actors (FSDP2 data parallel when > 1); the verifier, the reference and the algorithm stay in the
driver (they are light, or a subprocess pool already).

Placement is Ray's: the trainer ranks get a placement group of one bundle a rank, packed on one node
(``dist.trainer_placement=pack``) or spread over nodes (``spread``); the rollout workers get one of
their own, spread, on nodes without a trainer rank where those hold them all (``placement.worker_nodes``:
GPU trainer ranks and rollout workers on different nodes). Each bundle asks for what its actor uses: its
torch threads in CPUs (``cpu_share``) and, with ``run.device=cuda``, one GPU, which Ray then shows it
alone (docs/gpu.md). Every process group meets at an address on its rank 0's node (``sync.address``), within
``dist.rendezvous_timeout_s``, and a member that cannot reach it stops the run in one line.
"""

from __future__ import annotations

import math
from typing import Callable

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlpost.distributed import placement, sync
from rlpost.machine import threads
from rlpost.distributed.actors import RemoteTrainer, RolloutWorker, TrainerWorker, gather
from rlpost.distributed.pool import RolloutPool
from rlpost.sections import DistConfig
from rlpost.types.errors import RunError


def cpu_share(actor_threads: list[int], node_cpus: list[float]) -> float:
    """The share of its torch threads each actor asks Ray for, in CPUs: all of them where every actor
    of the run fits the smallest node at once, else scaled down until they do. Disaggregated phases
    take turns, and each phase's actors use every core (``threads``), so one host's actors ask for
    more threads than it has cores; asking for all of them would leave a 2-core machine unable to
    hold a trainer and two workers, and the scaling keeps any packing of the actors placeable."""
    need, room = sum(actor_threads), min(node_cpus)
    return 1.0 if need <= room else room / need


def cpus(threads: int, share: float) -> float:
    """What one actor asks for: Ray counts resources in steps of 1e-4, so round down, never to 0."""
    return max(1e-4, math.floor(threads * share * 1e4) / 1e4)


def start_ray(address: str) -> None:
    """Join the cluster at ``address``, or start a local one. A local one's processes (the GCS, the raylet, and the
    actors the raylet starts) begin a session of their own (``start_new_session``): a SIGTERM sent to the whole
    process group (`timeout`, Slurm's scancel, `kill -TERM -PGID`) then reaches this driver alone, which finishes
    its step and saves a checkpoint through the actors, instead of finding the GCS gone and hanging until Ray ends
    it. Nothing outlives the driver for it: ray.shutdown ends them, and Ray ties each to its parent's death
    (PR_SET_PDEATHSIG). Ray starts them through ``services.ConsolePopen``; where a Ray version has none, they start
    as before."""
    if ray.is_initialized():
        return
    try:
        from ray._private import services

        popen = services.ConsolePopen
    except (ImportError, AttributeError):
        services = popen = None
    if popen is not None:
        class Apart(popen):
            def __init__(self, *args, **kwargs):
                kwargs.setdefault("start_new_session", True)
                super().__init__(*args, **kwargs)

        services.ConsolePopen = Apart
    try:
        ray.init(address=address or None, include_dashboard=False, log_to_driver=True, configure_logging=False)
    finally:
        if popen is not None:
            services.ConsolePopen = popen


def node_cpus() -> list[float]:
    """The CPUs of each live node that has any (a head started with --num-cpus=0 holds no actor)."""
    return [n["Resources"]["CPU"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0] or [1.0]


def group(bundle: dict, n: int, strategy: str, what: str, timeout_s: float, nodes: list[str] | None = None):
    """A placement group of ``n`` copies of ``bundle`` (each held to its node of ``nodes`` where given), ready,
    and the address of each bundle's node. A cluster that cannot hold it stops the run in one line rather
    than wait for ever."""
    bundles = [placement.pinned(bundle, ip) for ip in nodes] if nodes else [dict(bundle) for _ in range(n)]
    pg = ray.util.placement_group(bundles, strategy=strategy)
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(pg)
        have = ", ".join(f"{n['NodeManagerAddress']}: {n['Resources'].get('CPU', 0):g} CPU "
                         f"{n['Resources'].get('GPU', 0):g} GPU" for n in ray.nodes() if n["Alive"])
        raise RunError(f"Ray could not place {n} {what} ({bundle} each, {strategy}) within "
                       f"dist.rendezvous_timeout_s={timeout_s:g} s; the cluster has {have}: add nodes, or lower "
                       "dist.rollout_workers / dist.trainer_ranks (or dist.trainer_placement=spread)") from None
    ip = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    on = ray.util.placement_group_table(pg)["bundles_to_node_id"]
    return pg, [ip.get(on[i], "?") for i in range(n)]


def in_group(cls, pg, i: int):
    return cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i))


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
    ranks, workers, wait_s = dist.trainer_ranks, dist.rollout_workers, dist.rendezvous_timeout_s
    share = cpu_share([t_threads] * ranks + [r_threads] * workers, node_cpus())
    gpus = 1 if on_gpu else 0  # one GPU per actor; never run on one (docs/gpu.md)
    t_cpus, r_cpus = cpus(t_threads, share), cpus(r_threads, share)
    t_pg, t_nodes = group({"CPU": t_cpus, "GPU": gpus} if gpus else {"CPU": t_cpus}, ranks,
                          "STRICT_PACK" if dist.trainer_placement == "pack" else "SPREAD", "trainer rank(s)", wait_s)
    w_bundle = {"CPU": r_cpus, "GPU": gpus} if gpus else {"CPU": r_cpus}
    apart = placement.worker_nodes(placement.alive(ray.nodes()), t_nodes, w_bundle, workers)  # None: anywhere
    w_pg, w_nodes = group(w_bundle, workers, "SPREAD", "rollout worker(s)", wait_s, apart)
    initial = ray.put(weights) if weights is not None else None
    trainer_cls = ray.remote(num_cpus=t_cpus, num_gpus=gpus)(TrainerWorker)
    trainer = RemoteTrainer([in_group(trainer_cls, t_pg, r).remote(t_threads) for r in range(ranks)], (t_pg, w_pg))
    pool, is_async = None, dist.topology == "async"
    try:
        partial = is_async and dist.partial_rollouts  # two chunks and an offer of weights at once
        worker_cls = ray.remote(num_cpus=r_cpus, num_gpus=gpus, max_restarts=0,
                                max_concurrency=3 if partial else 1)(rollout_worker or RolloutWorker)
        # A restarted worker goes back into its own bundle, which Ray moves to a node left if its own is lost;
        # a bundle held to a lost node cannot move, so that worker starts wherever Ray finds room.
        def spawn(i, w):
            if apart and apart[i] not in {x["ip"] for x in placement.alive(ray.nodes())}:
                return worker_cls.remote(make_sampler, w, r_threads, seed)
            return in_group(worker_cls, w_pg, i).remote(make_sampler, w, r_threads, seed)
        # The workers' processes start (Ray creates actors in the background) while the trainer's ranks build:
        # each start imports torch and builds a model, seconds that overlap instead of adding up.
        pool = RolloutPool(spawn, workers, dist.chunk_prompts, dist.max_staleness if is_async else 0,
                           initial_weights=initial, say=say, stream=stream if is_async else None, partial=partial)
        start_trainer(trainer, make_trainer, initial, sampler_dtype, wait_s)
        if dist.weight_sync == "broadcast":
            join_broadcast(trainer, pool, gpus > 0, wait_s)
    except BaseException:
        if pool is not None:
            pool.close()
        trainer.close()  # and the placement groups
        raise
    say(f"topology {dist.topology}: {workers} rollout worker(s) x {r_threads} thread(s), "
        f"{ranks} trainer rank(s) x {t_threads}" + (f", max_staleness {dist.max_staleness}" if is_async else "")
        + (", partial rollouts (weights between decode steps)" if is_async and dist.partial_rollouts else "")
        + (", weights by broadcast" if dist.weight_sync == "broadcast" else ""))
    say(f"placement: trainer rank(s) on {', '.join(t_nodes)} ({dist.trainer_placement}, {t_cpus:g} CPU"
        + (" 1 GPU" if gpus else "") + f" each); rollout worker(s) on {', '.join(w_nodes)} ({r_cpus:g} CPU"
        + (" 1 GPU" if gpus else "") + (" each, away from the trainer's nodes)" if apart else " each)"))
    return pool, trainer


def start_trainer(trainer: RemoteTrainer, make_trainer: Callable, initial, sampler_dtype: str, wait_s: float) -> None:
    """Rank 0 first says where the ranks meet (its node's address: ``TrainerWorker.rendezvous``), then
    every rank joins there and builds its trainer. A rank that cannot reach rank 0 stops the run
    within ``wait_s`` seconds, in one line naming the address (``sync.unreachable``)."""
    h, world = trainer.handles, len(trainer.handles)
    try:
        master = ray.get(h[0].rendezvous.remote(), timeout=wait_s) if world > 1 else ""
        gather([x.start.remote(make_trainer, initial, sampler_dtype, r, world, master, wait_s)
                for r, x in enumerate(h)])
    except ray.exceptions.GetTimeoutError:
        raise RunError(f"trainer rank 0 did not start within dist.rendezvous_timeout_s={wait_s:g} s") from None
    except sync.Unreachable as e:
        raise RunError(message(e)) from None


def message(error: BaseException) -> str:
    """The one line an actor's own error carries (Ray adds the remote traceback around it)."""
    cause = getattr(error, "cause", None) or error
    return str(cause.args[0]) if cause.args else str(cause)


def join_broadcast(trainer: RemoteTrainer, pool: RolloutPool, on_gpu: bool, wait_s: float) -> None:
    """dist.weight_sync=broadcast: trainer rank 0 (member 0) and every rollout worker form one
    group at an address rank 0 picks on its node, told once what each push carries (distributed/sync.py).
    A member that cannot reach it stops the run within ``wait_s`` seconds, in one line."""
    addr = ray.get(trainer.handles[0].sync_address.remote())
    sp = gather([h.weight_spec.remote() for h in trainer.handles])[0]
    world = 1 + len(pool.workers)
    try:
        gather([h.join_sync.remote(addr, world, wait_s) for h in trainer.handles]
               + [w.join_sync.remote(addr, i + 1, world, sp, on_gpu, wait_s) for i, w in enumerate(pool.workers)])
    except sync.Unreachable as e:
        raise RunError(message(e)) from None
    trainer.broadcast = pool.broadcast = True
