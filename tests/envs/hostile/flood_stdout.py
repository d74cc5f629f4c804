"""exhaustion: print a megabyte per line forever."""
# form: call
while True:
    print("x" * 10 ** 6)
