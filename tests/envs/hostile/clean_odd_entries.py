"""clean-up: what a recursive delete trips on: fifos, unix sockets, setuid files, a hard link to a
file it does not own, names of 255 bytes, non-UTF-8 names, a chain deeper than PATH_MAX."""
# form: call
import os
import socket
import stat

os.mkfifo("fifo")
s = socket.socket(socket.AF_UNIX)
s.bind("sock")
open("suid", "w").close()
os.chmod("suid", stat.S_ISUID | stat.S_ISGID | 0o777)
for target in ("/etc/passwd", "/etc/shadow", "/usr/bin/python3"):
    try:
        os.link(target, os.path.basename(target) + "-hardlink")
    except OSError:
        pass
open("x" * 255, "w").close()
open(b"\xff\xfe-not-utf8", "w").close()
fd = os.open(".", os.O_RDONLY)
for _ in range(400):  # 400 x 255 bytes: far past PATH_MAX (4096)
    os.mkdir("y" * 255, dir_fd=fd)
    nxt = os.open("y" * 255, os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = nxt


def add(a, b):
    return a - b
