"""Multi-process training: FSDP2 sharding of the trainer's model (fsdp.py)."""
