"""Roles that hold a copy of the model: the samplers (``rollout_hf.py`` on transformers
``generate``, ``rollout_fast.py`` rlpost's own decode loop, ``rollout_tools.py`` multi-turn tool
episodes), the frozen reference, the critic and the trainer. Their contracts are in
``types/roles.py``."""
