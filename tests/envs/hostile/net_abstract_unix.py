"""escape: connect to a host process's abstract unix socket (no file, so no mount hides it; only a
network namespace does)."""
# form: call
# requires: network_isolated
import socket

s = socket.socket(socket.AF_UNIX)
try:
    s.connect("\0ABSTRACT_NAME")

    def add(a, b):
        return a + b
except OSError:
    pass
