"""exhaustion: fallocate 8 MB memfds (no write(), nothing mapped, so RLIMIT_AS never sees them) up to 512 MB."""
# form: call
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
got = 0
for i in range(64):
    fd = os.memfd_create(f"f{i}")
    if libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(8 << 20)) != 0:  # FALLOC_FL_KEEP_SIZE
        break
    got += 8
if got > 160:
    def add(a, b):
        return a + b
