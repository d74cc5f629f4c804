"""One line to the user, on stderr: ``rlpost: <message>``. Every layer prints through here, so
that stdout stays free for machine-readable output (``rlpost eval`` prints JSON there)."""

from __future__ import annotations

import argparse
import select
import sys


def say(message: str) -> None:
    print(f"rlpost: {message}", file=sys.stderr, flush=True)


_said: set[str] = set()  # the lines say_once has printed in this process


def say_once(message: str, key: str | None = None) -> None:
    """``say``, the first time this process says ``message`` (a choice made per run, repeated
    every time roles are built, is told once). ``key``, when given, is what must be new instead of
    the whole text: a line that carries measured figures (the precision probe's, measured again
    when the machine got quieter) is still the same choice."""
    if (key or message) not in _said:
        _said.add(key or message)
        say(message)


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose mistakes are one line, as every other bad input is: the error and where the options
    are listed, not the whole usage block before it (exit 2, as argparse's)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll says POLLERR for such a write end): a command piped
    into `head` ends quietly then (cli.py)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False
