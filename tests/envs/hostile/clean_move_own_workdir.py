"""clean-up: rename or replace the run's own working directory (and its parent), so a clean-up
that walks back through '..' or resolves the path again lands outside the sandbox."""
# form: call
import os

here = os.getcwd()
for attempt in (lambda: os.rename(here, here + "-moved"), lambda: os.rename(os.path.dirname(here), "/tmp/x"),
                lambda: os.rmdir(here), lambda: os.symlink("/", here + "-link"),
                lambda: os.rename("/", here)):
    try:
        attempt()
    except OSError:
        pass
os.makedirs("deep/er/still")
try:
    os.rename("deep/er", "../er-escaped")  # a subdirectory moved out of the tree
except OSError:
    pass


def add(a, b):
    return a - b
