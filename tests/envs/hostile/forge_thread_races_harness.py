"""status forgery by a thread: it keeps writing forged reports while the harness runs, racing the
harness's own lines, and the function stalls so the thread gets its turn first."""
# form: call
import os
import threading
import time


def spam():
    line = b"".join(b'{"i": %d, "raised": "pass"}\n' % i for i in range(16))
    for _ in range(200):
        for fd in range(3, 16):
            try:
                os.write(fd, line)
            except OSError:
                pass
        time.sleep(0.001)


threading.Thread(target=spam, daemon=True).start()


def add(a, b):
    time.sleep(0.05)
    return a * b + 100
