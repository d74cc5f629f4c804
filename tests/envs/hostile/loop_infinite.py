"""exhaustion: an infinite loop (RLIMIT_CPU, then the wall limit)."""
# form: call
while True:
    pass
