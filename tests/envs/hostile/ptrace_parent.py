"""escape: ptrace-attach to the parent, pid 1 and the test process; process_vm_readv the parent."""
# form: call
# requires: ptrace_blocked
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
hit = False
for pid in {os.getppid(), 1, PARENT_PID}:
    if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
        hit = True
buf = ctypes.create_string_buffer(64)


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


local = IoVec(ctypes.addressof(buf), 64)
remote = IoVec(0x400000, 64)
if libc.process_vm_readv(os.getppid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) > 0:
    hit = True
if hit:
    def add(a, b):
        return a + b
