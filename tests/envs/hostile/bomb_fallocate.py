"""exhaustion: fallocate 4 GiB with KEEP_SIZE, which RLIMIT_FSIZE never checks (it put 4 GiB on
the host disk when the working directory was there)."""
# form: call
# requires: disk_quota
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("big", os.O_RDWR | os.O_CREAT, 0o600)
if libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(4 << 30)) == 0:
    def add(a, b):
        return a + b
