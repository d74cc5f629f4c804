"""exhaustion: fill /dev/shm (host RAM when it is the host's)."""
# form: call
# requires: fs_write_isolated
import os

wrote = 0
for i in range(40):
    try:
        with open(f"/dev/shm/MARK-{i}", "wb") as f:
            f.write(b"x" * (8 << 20))
        wrote += 8
    except OSError:
        break
if wrote:
    def add(a, b):
        return a + b
