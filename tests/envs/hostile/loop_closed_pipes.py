"""exhaustion: close stdout and stderr (so the pipes look finished), then keep running."""
# form: call
import os

os.close(1)
os.close(2)
while True:
    pass
