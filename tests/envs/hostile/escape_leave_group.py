"""escape: children that leave the process group and the session, then keep spinning."""
# form: call
import os
import time

for _ in range(4):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            while True:
                pass
        os._exit(0)
time.sleep(0.2)
