"""exhaustion (stdin/stdout form): one endless line on stdout."""
# form: io
import os

while True:
    os.write(1, b"z" * (1 << 20))
