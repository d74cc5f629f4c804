"""The lowest layer: the batch that crosses every role boundary (``batch.py``), the role
contracts the loop relies on (``roles.py``) and the errors every layer may raise (``errors.py``).
Nothing here imports the rest of rlpost."""
