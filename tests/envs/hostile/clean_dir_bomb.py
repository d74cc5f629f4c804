"""clean-up: as many empty directories as the run allows (20k+ on a plain disk in its wall time),
then the working directory locked (chmod 000). Removing it re-listed a directory after each
subdirectory (quadratic: 25-36 s for ~20k), past the worker's deadline, and the next run's sweep
stalled again."""
# form: call
import os
import time

stop = time.monotonic() + 1.5
n = 0
try:
    while time.monotonic() < stop:
        os.mkdir(f"d{n}")
        n += 1
except OSError:
    pass
os.chmod(".", 0)


def add(a, b):
    return a - b
