"""escape: become root (setuid/setgid 0), directly or through a setuid binary."""
# form: call
import os
import subprocess

hit = False
for f in (lambda: os.setgid(0), lambda: os.setuid(0)):
    try:
        f()
        hit = True
    except OSError:
        pass
for binary in ("/usr/bin/su", "/usr/bin/sudo", "/usr/bin/newgrp"):
    try:
        out = subprocess.run([binary, "-c", "id -u"] if binary.endswith("su") else [binary],
                             capture_output=True, text=True, timeout=1, input="")
        hit = hit or out.stdout.strip() == "0"
    except (OSError, subprocess.SubprocessError):
        pass
if hit:
    def add(a, b):
        return a + b
