"""Roles behind process boundaries: Ray actors for the rollout workers and the trainer
(``topology.py`` places them, ``actors.py`` holds them) and the driver-side pool that feeds the
workers, bounds staleness and survives a dead worker (``pool.py``). Needs the optional ``ray``
extra; a colocated run imports none of it (``build.py`` imports it only for a Ray topology). The
trainer's FSDP2 sharding is in ``model/fsdp.py``."""
