"""Entry points that wire the roles together and own a loop: the RL loop (``rl.py``), held-out
evaluation (``evaluate.py``), offline and online preference training (``offline.py``,
``online.py``), the multi-stage pipeline, process-reward-model training (``prm.py``) and test-time
search (``search.py``). The YAML files in the repository's ``recipes/`` folder configure them."""
