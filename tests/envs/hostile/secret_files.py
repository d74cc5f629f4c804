"""escape: read a world-readable secret, /etc/shadow, root's ssh key, the home listing."""
# form: call
# requires: fs_read_isolated
import os

leaked = []
for p in ("SECRET_PATH", "/etc/shadow", "/root/.ssh/id_rsa", "/etc/passwd"):
    try:
        leaked.append(open(p).read())
    except OSError:
        pass
for d in ("/root", "/home", "/work"):
    try:
        leaked += os.listdir(d)
    except OSError:
        pass
if leaked:
    def add(a, b):
        return a + b
