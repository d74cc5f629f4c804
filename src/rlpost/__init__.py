"""rlpost: RL post-training of language models.

One process-wide setting is made here, before anything imports torch: OpenMP threads that wait
sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, read by libgomp once, when torch loads).
With GNU OpenMP's default (spin ~300k iterations at every barrier), a torch op split over both
cores waits for whichever thread the kernel has descheduled, while the other spins on the core
that thread needs. Beside one busy process (``stress-ng --cpu 1``) a decode-sized op on 2 threads
ran 7x slower spinning than sleeping (115.7 vs 16.7 ms; benchmarks/README.md, "Contention").
An explicit ``OMP_WAIT_POLICY`` in the environment wins; so does importing torch before rlpost.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
