"""escape: read a key from the inherited session keyring (possession beats uid checks)."""
# form: call
# requires: keyring_isolated
import ctypes

libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(256)
if libc.syscall(250, 11, KEY_ID, buf, 256) > 0:  # keyctl(KEYCTL_READ)
    def add(a, b):
        return a + b
