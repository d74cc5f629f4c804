"""exhaustion: write to stderr forever."""
# form: call
import sys

while True:
    sys.stderr.write("y" * 10 ** 6)
