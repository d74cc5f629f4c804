"""escape: write files outside the working directory (/tmp, home, /, .., /var/tmp, /dev/shm)."""
# form: call
# requires: fs_write_isolated
import os

wrote = []
for p in ("/tmp/MARK", "HOST_HOME/MARK", "/MARK", "../MARK", "/var/tmp/MARK", "/dev/shm/MARK"):
    try:
        with open(p, "w") as f:
            f.write("x")
        wrote.append(p)
    except OSError:
        pass
if wrote:
    def add(a, b):
        return a + b
