"""Keep freed memory in the process for reuse (``keep_freed``), and give it back to the operating
system every few updates (``trim``).

Every page a process gets from the kernel costs a page fault the first time it is touched (~4 us,
zeroing included). glibc serves blocks of 32 MB and more (and, until its threshold has adapted,
smaller ones) from fresh mappings and unmaps them on ``free``; the heap's top is trimmed whenever
64 MB lie free there. A trainer update of the speed benchmark's configuration allocates and frees
the same few GB every step (activations, the lm_head's (tokens, vocabulary) logits, gradients), so
it faulted ~200K pages, ~0.8 GB, back in on every update (~1 s of system time). ``keep_freed``
turns both off for the process (``mallopt(M_MMAP_MAX, 0)``, ``M_TRIM_THRESHOLD`` at its maximum):
every block comes from the heap and stays there when freed. Measured on the trainer alone
(two captured batches, alternating, Zen 4, 2026-11-26): update median 5.31 vs 6.44 s and 4.92 vs
6.60 s in two runs, minor faults per update 0 vs ~200K, the same peak RSS (4.03 vs 4.01 GB); over a
6-step vs_trl.py run the peak RSS was 4.78 vs 4.63 GiB. The trainer calls it on a CPU run.

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
def find_libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


TRIM_EVERY = 10  # updates between trims (Trainer.update)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt's parameters (malloc.h)
_kept = False


def keep_freed() -> bool:
    """Serve every block from the heap and keep freed memory there (module doc); whether it took.
    Process-wide and idempotent; ``trim`` still returns the free pages when called."""
    global _kept
    libc = find_libc()
    if libc is not None and not _kept and hasattr(libc, "mallopt"):
        _kept = bool(libc.mallopt(M_MMAP_MAX, 0)) & bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    return _kept


def trim() -> None:
    libc = find_libc()
    if libc is not None:
        libc.malloc_trim(0)
