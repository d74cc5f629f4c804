"""exhaustion: start threads until the process cap stops it (breach above max_processes)."""
# form: call
import threading
import time

started = 0
try:
    for _ in range(500):
        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
        started += 1
except (RuntimeError, MemoryError):
    pass
if started > 16:
    def add(a, b):
        return a + b
