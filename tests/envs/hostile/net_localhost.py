"""escape: connect to a service on the host's loopback."""
# form: call
# requires: network_isolated
import socket

try:
    socket.create_connection(("127.0.0.1", HOST_PORT), timeout=1).sendall(b"MARK")

    def add(a, b):
        return a + b
except OSError:
    pass
