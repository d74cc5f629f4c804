"""exhaustion: a swarm of spinning child interpreters, each with its own CPU budget."""
# form: call
import subprocess
import sys
import time

procs = []
for _ in range(40):
    try:
        procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
    except OSError:
        break
time.sleep(30)
