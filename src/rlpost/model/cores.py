"""How many threads torch computes on: every core this process may use, one fewer for each core
that other processes keep busy (``run.threads=0``, the default).

Why it moves. Between torch's parallel ops, GNU OpenMP's threads spin-wait for the next one
(libgomp's default, ~300k spins: a few ms) instead of sleeping. On a quiet machine that is what
makes a decode step cheap: its ~180 parallel matmuls follow each other tens of microseconds
apart, and waking a sleeping thread for each cost ~15 ms a step at a few rows (the loop's
generation 4.0 s sleeping after ~10 us, 2.9 s spinning; benchmarks/README.md, ``contention.py``).
Beside a busy process it is what makes a step slow: a thread spins on the core the thread it
waits for needs, and the step took 3.3-4.0x its time alone. One thread per free core avoids both:
no spinning team member competes with the neighbour, and alone every core works.

How it knows. ``adjust`` (the loop calls it before each rollout and each update) reads the busy
time of this process's cores from /proc/stat since its last call, takes away this process's own
CPU time and its children's (verifier workers, sandboxes), and what is left is other processes'
work, in cores. The n-th core counts as taken from n - 0.4 cores of others' work, and as free
again below n - 0.7 (a margin, so a neighbour near half a core does not flip the count every
step); at least one thread always stays. The
time stolen by a hypervisor from these cores counts as others' work too. Where /proc/stat is
missing (not Linux) the count stays at every core. An explicit ``run.threads=N`` is left alone.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

TAKEN, FREED = 0.6, 0.3  # others' work, in cores, above which a core is given up / below which taken back
MIN_INTERVAL_S = 0.5  # shorter intervals than this are too noisy to decide on (USER_HZ ticks of 10 ms)
STAT = Path("/proc/stat")


@dataclass
class Sample:
    wall: float  # time.monotonic()
    busy: float  # seconds these cores were not idle (user, nice, system, irq, softirq, steal)
    ours: float  # CPU seconds of this process and its children, all threads


def sample(cpus: list[int]) -> Sample | None:
    """Now's counters, or None where /proc/stat cannot be read."""
    try:
        lines = STAT.read_text().splitlines()
    except OSError:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    want, busy = {f"cpu{c}" for c in cpus}, 0.0
    for line in lines:
        name, *ticks = line.split()
        if name in want:  # user nice system idle iowait irq softirq steal [guest guest_nice, inside user]
            t = [int(x) for x in ticks[:8]]
            busy += (t[0] + t[1] + t[2] + t[5] + t[6] + t[7]) / hz
    me = psutil.Process()
    ours = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            ours += sum(child.cpu_times()[:2])
        except psutil.Error:  # ended between the listing and the read
            pass
    return Sample(time.monotonic(), busy, ours)


class Cores:
    """torch's thread count for this process (``run.threads``): fixed when configured, else moved by
    ``adjust``. Construct it where the run starts; it sets the count at once."""

    def __init__(self, configured: int = 0):
        self.cpus = (sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                     else list(range(os.cpu_count() or 1)))
        self.auto = configured == 0
        self.most = configured or len(self.cpus)
        self.threads = self.most
        self.others = 0.0  # the last interval's other work, in cores (the run logs it)
        self.last = sample(self.cpus) if self.auto else None
        torch.set_num_threads(self.threads)

    def adjust(self) -> int:
        """The thread count for the work about to start, from the other processes' work since the
        last call; sets it in torch (for this thread: OpenMP's count is per calling thread)."""
        if not self.auto or self.last is None:
            return self.threads
        now = sample(self.cpus)
        if now is None or now.wall - self.last.wall < MIN_INTERVAL_S:
            return self.threads
        self.others = max(0.0, (now.busy - self.last.busy) - (now.ours - self.last.ours)) / (now.wall - self.last.wall)
        self.last = now
        taken = self.most - self.threads  # cores given up so far
        up, down = int(self.others + 1 - TAKEN), int(self.others + 1 - FREED)  # floors: others >= 0
        taken = up if up > taken else down if down < taken else taken  # between the two: as it was
        self.threads = self.most - min(max(taken, 0), self.most - 1)
        torch.set_num_threads(self.threads)
        return self.threads
