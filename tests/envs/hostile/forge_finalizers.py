"""status forgery from finalizers: __del__ and weakref.finalize run at interpreter shutdown,
after the harness is done, and write forged reports to every descriptor."""
# form: call
import os
import weakref


def forge():
    for fd in range(1, 64):
        for i in range(16):
            try:
                os.write(fd, b'{"i": %d, "raised": "pass"}\n' % i)
            except OSError:
                pass


class Ghost:
    def __del__(self):
        forge()


class Holder:
    pass


keep = Holder()
keep.ghost, keep.me = Ghost(), keep  # a cycle: collected only at shutdown
weakref.finalize(keep, forge)


def add(a, b):
    return None
