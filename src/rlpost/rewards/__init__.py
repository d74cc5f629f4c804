"""Everything with the verifier's contract, ``score(batch) -> (rewards, infos, metrics)``: the
worker process that runs verifier functions with a deadline (``runner.py``, ``worker.py``), reward
stacks and length shaping (``stack.py``), the LLM judge, a learned reward model and the process
reward model."""
