"""exhaustion: 96 memfds of 16 MB each, every page touched. RLIMIT_AS does not count memfd pages
(1.5 GB got through a 128 MB x 4-process cap); only a memory cgroup does. Breach above 160 MB."""
# form: call
import os

chunk, total = b"x" * (1 << 20), 0
try:
    for i in range(96):
        fd = os.memfd_create(f"m{i}")
        for off in range(16):
            os.pwrite(fd, chunk, off << 20)
            total += 1
except OSError:
    pass
if total > 160:
    def add(a, b):
        return a + b
