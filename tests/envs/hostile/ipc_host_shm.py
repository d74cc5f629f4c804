"""escape: attach the host's SysV shared memory segment by its key and read it."""
# form: call
# requires: ipc_isolated
import ctypes

libc = ctypes.CDLL(None, use_errno=True)
if libc.shmget(SHM_KEY, 0, 0) >= 0:
    def add(a, b):
        return a + b
