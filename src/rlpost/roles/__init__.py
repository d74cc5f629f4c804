"""Roles that hold a copy of the model: the samplers (``rollout_hf.py`` on transformers
``generate``, ``rollout_fast.py`` rlpost's own decode loop, ``rollout_env.py`` multi-turn
environment episodes around any of them), the frozen reference, the critic and the trainer. Their contracts are in
``types/roles.py``."""
