"""escape: reach the internet (a public DNS server, then name resolution)."""
# form: call
# requires: network_isolated
import socket

ok = False
for attempt in (lambda: socket.create_connection(("1.1.1.1", 53), timeout=1),
                lambda: socket.getaddrinfo("pypi.org", 443)):
    try:
        attempt()
        ok = True
    except OSError:
        pass
if ok:
    def add(a, b):
        return a + b
