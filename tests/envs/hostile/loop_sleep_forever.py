"""exhaustion: sleep without using CPU, so only the wall limit can end it."""
# form: call
import time

time.sleep(10 ** 6)
