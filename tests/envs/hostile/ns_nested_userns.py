"""escape: make a nested user namespace (root inside it), the door to mounts and kernel attack surface."""
# form: call
# requires: userns_blocked
import ctypes

libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000) == 0:  # CLONE_NEWUSER
    def add(a, b):
        return a + b
