"""exhaustion: fill the working directory 1 MB at a time in many files (RLIMIT_FSIZE is per file).
Breach above max_disk_mb = 32."""
# form: call
# requires: disk_quota
import os

wrote = 0
try:
    for i in range(200):
        with open(f"fill-{i}", "wb") as f:
            for _ in range(8):
                f.write(b"x" * (1 << 20))
                f.flush()
                wrote += 1
except OSError:
    pass
if wrote > 32:
    def add(a, b):
        return a + b
