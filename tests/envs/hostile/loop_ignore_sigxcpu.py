"""exhaustion: ignore SIGXCPU (the soft CPU limit) and keep spinning."""
# form: call
import signal

signal.signal(signal.SIGXCPU, signal.SIG_IGN)
while True:
    pass
