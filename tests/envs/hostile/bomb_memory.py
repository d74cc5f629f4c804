"""exhaustion: one 10 GB allocation."""
# form: call
x = bytearray(10 * 1024 ** 3)


def add(a, b):
    return a + b
