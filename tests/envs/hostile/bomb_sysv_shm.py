"""exhaustion: SysV shared memory segments, touched and then detached, so RLIMIT_AS (which counts
only what is mapped) never sees them. Breach above 160 MB. Under rlimits they would outlive the run."""
# form: call
# requires: ipc_isolated
import ctypes

libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
total = 0
for _ in range(32):
    sid = libc.shmget(0, 16 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    if sid < 0:
        break
    addr = libc.shmat(sid, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        break
    ctypes.memset(addr, 1, 16 << 20)
    libc.shmdt(ctypes.c_void_p(addr))
    total += 16
if total > 160:
    def add(a, b):
        return a + b
