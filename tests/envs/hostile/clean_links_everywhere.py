"""clean-up: symbolic links to the host's roots and to the run's own parents, at every level of a
tree, with directories made unreadable and unwritable so a clean-up must chmod them (a chmod
that follows a link changes the host)."""
# form: call
import os

targets = ["/", "/etc", "/root", "/tmp", "/usr", "..", "../..", os.path.expanduser("~"), "/proc/1/root",
           "/proc/self/cwd/.."]
os.makedirs("a/b/c/d")
for level in ("", "a", "a/b", "a/b/c", "a/b/c/d"):
    for k, target in enumerate(targets):
        try:
            os.symlink(target, os.path.join(level or ".", f"link{k}"))
        except OSError:
            pass
for level, mode in (("a/b/c/d", 0), ("a/b/c", 0o500), ("a/b", 0o100), ("a", 0)):
    os.chmod(level, mode)


def add(a, b):
    return a - b
