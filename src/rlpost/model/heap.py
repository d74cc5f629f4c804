"""Give freed heap memory back to the operating system, every few updates.

glibc's malloc raises its mmap threshold as large blocks are freed, so after the first update the
(B, T, ...) activation tensors come from the heap, and when they are freed the heap keeps the pages:
measured on the speed benchmark's configuration, resident memory after an update was 5.75 GB, of
which malloc_trim(0) returned 3.1 GB to the system (2.65 GB left: weights, AdamW state, the sampler).

Trimming after *every* update cost more than it saved: the next update touches those pages again,
and faulting ~2.5 GB back in took 2-3 s of system time per update (~630K minor faults; 13% of the
update's CPU time in the profile, mostly in the bf16<->float32 casts of fresh tensors). Kept
resident, the next update reuses them (~200K faults, from the tensors over glibc's 32 MB mmap
limit): updates 0.94-0.96x as long, same batches, alternating in one process
(benchmarks/heap_trim.py). What that costs is fragmentation: without any trim the resident size
after an update crept up by ~0.05 GB per step. ``TRIM_EVERY`` bounds that creep. Elsewhere than
glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


TRIM_EVERY = 10  # updates between trims (Trainer.update)


def trim() -> None:
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
