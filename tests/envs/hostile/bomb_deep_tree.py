"""exhaustion: a 1500-deep directory tree, then chmod 000 at the top. A recursive cleanup raised
RecursionError and turned the *next* correct solution's reward into a verifier error."""
# form: call
import os

os.mkdir("d")
fd = os.open("d", os.O_RDONLY)
for _ in range(1500):
    os.mkdir("d", dir_fd=fd)
    nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = nxt
os.chmod("d", 0)


def add(a, b):
    return a - b
