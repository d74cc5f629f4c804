"""exhaustion: create empty files until something stops it (inodes are kernel memory)."""
# form: call
# requires: disk_quota
import os

n = 0
try:
    while n < 300000:
        os.close(os.open(f"f{n}", os.O_CREAT | os.O_WRONLY, 0o600))
        n += 1
except OSError:
    pass
