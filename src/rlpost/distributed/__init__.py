"""Roles behind process boundaries: Ray actors for the rollout workers and the trainer
(``topology.py`` places them by config, ``actors.py`` holds them), the driver-side pool that feeds
the workers, bounds staleness and survives a dead worker (``pool.py``), and FSDP2 data-parallel
sharding of the trainer (``fsdp.py``). A colocated run imports none of it."""
