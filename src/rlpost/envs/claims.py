"""Reading a claimed return value against the expected one: the equality rule of the grading
contract (envs/grading.py; docs/environments.md has it as a table).

A claim is what the sandbox's harness wrote, as json.loads gives it back (None, bool, int, float,
str, list and the tagged ``{"$tuple": ...}``, ``{"$dict": ...}``, ``{"$set": ...}``,
``{"$bytes": ...}``), and the program may have written it itself, so it is read here, never
trusted: checked for form in one pass that builds nothing (``well_formed``), then walked along the
expected value's shape (``same``), so a claim of another type or length fails before anything is
built from it and no claim costs more than its size. The verdict is the one Python gives the
test's assert on that value, except that bool is never a number here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    """A bool inside a set or a dict key. Python hashes True as 1, so {True} == {1} and {1: x} ==
    {True: x}; wrapped, a bool key equals only the same bool."""
    value: bool


def well_formed(v, member: bool = False) -> bool:
    """Whether a claimed value (json.loads output) is one the harness's encoder can write; `member`:
    it stands where Python needs a hashable (a set member, a dict key). One linear pass, nothing built."""
    if v is None or type(v) in (bool, int, float, str):
        return True
    if type(v) is list:
        return not member and all(well_formed(x) for x in v)
    if type(v) is not dict or len(v) != 1:
        return False
    (tag, body), = v.items()
    if tag == "$bytes":
        return type(body) is str and len(body) % 2 == 0 and not body.strip("0123456789abcdef")
    if type(body) is not list:
        return False
    if tag == "$tuple":
        return all(well_formed(x, member) for x in body)
    if tag == "$set":
        return all(well_formed(x, True) for x in body)
    return (tag == "$dict" and not member
            and all(type(p) is list and len(p) == 2 and well_formed(p[0], True) and well_formed(p[1]) for p in body))


def _tagged(claim, tag: str):
    """The body of a claim tagged `tag` ({"$set": [...]}), else None."""
    return claim.get(tag) if type(claim) is dict else None


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def same(claim, exp, tol: tuple[float, float] | None = None) -> bool:
    """The equality rule (docs/environments.md has it as a table): whether a well-formed claim (as
    the harness writes it, json.loads output) equals `exp` (grading.canon) as Python's == finds it, except
    that bool is never a number and a bool set member or dict key never the int. `tol`: (rel_tol,
    abs_tol) of a math.isclose test (or a structured one's), applied to every number but set
    members and dict keys. Read against exp's shape: another type or length fails before anything
    is built from the claim."""
    if isinstance(exp, bool) or exp is None:
        return type(claim) is type(exp) and claim == exp
    if is_number(exp):
        if type(claim) not in (int, float):
            return False
        if tol is None:
            return claim == exp  # Python's: int == int exactly, int == float by exact value, NaN equal to nothing
        try:
            return math.isclose(claim, exp, rel_tol=tol[0], abs_tol=tol[1])
        except OverflowError:  # an int too large for a float: math.isclose raises, so Python's assert fails
            return False
    if isinstance(exp, str):
        return type(claim) is str and claim == exp
    if isinstance(exp, list):
        return type(claim) is list and len(claim) == len(exp) and all(same(c, e, tol) for c, e in zip(claim, exp))
    if isinstance(exp, tuple):
        body = _tagged(claim, "$tuple")
        return body is not None and len(body) == len(exp) and all(same(c, e, tol) for c, e in zip(body, exp))
    if isinstance(exp, bytes):
        body = _tagged(claim, "$bytes")
        return body is not None and len(body) == 2 * len(exp) and bytes.fromhex(body) == exp
    if isinstance(exp, frozenset):
        body = _tagged(claim, "$set")
        return body is not None and len(body) == len(exp) and _match_members(body, list(exp)) is not None
    body = _tagged(claim, "$dict")  # exp is a dict
    if body is None or len(body) != len(exp):
        return False
    keys = list(exp)
    found = _match_members([k for k, _ in body], keys)
    return found is not None and all(same(v, exp[keys[i]], tol) for (_, v), i in zip(body, found))


def _match_members(claimed: list, members: list) -> list[int] | None:
    """For claimed set members (or dict keys), the index in `members` (the expected ones, frozen) of
    the one each equals, one to one; None if any has none or shares one. Each is looked up in a table
    of the expected members, never put in a table of claimed ones: a claim whose members all hash
    alike (multiples of 2**61 - 1) would make that table quadratic. A claimed member larger than
    every expected one, or past their total, fails unbuilt: what is built (a nested set) is bounded
    by the expected value's size."""
    index = {m: i for i, m in enumerate(members)}
    sizes = [_size(m) for m in members]
    largest, budget = max(sizes, default=0), sum(sizes)
    seen = bytearray(len(members))
    found = []
    for c in claimed:
        limit = min(largest, budget)
        n = _size(c, limit)
        if n > limit:
            return None
        budget -= n
        i = index.get(_frozen(c))
        if i is None or seen[i]:
            return None
        seen[i] = 1
        found.append(i)
    return found


def _size(v, limit: float = math.inf) -> int:
    """Nodes in a claimed or expected value (a container and each thing in it), counted up to just past `limit`."""
    if type(v) is dict and len(v) == 1:  # a tagged claim
        v = next(iter(v.values()))
        if type(v) is str:
            return 1
    if not isinstance(v, (list, tuple, frozenset)):
        return 1
    n = 1
    for x in v:
        n += _size(x, limit - n)
        if n > limit:
            break
    return n


def _frozen(claim):
    """A well-formed claimed member -> the hashable value Python would have had (tuple, frozenset, bytes, Flag)."""
    if type(claim) is bool:
        return Flag(claim)
    if type(claim) is not dict:
        return claim
    (tag, body), = claim.items()
    if tag == "$bytes":
        return bytes.fromhex(body)
    members = [_frozen(x) for x in body]
    return tuple(members) if tag == "$tuple" else frozenset(members)


def within(claim, exp, bound: tuple[str, int | float, bool]) -> bool:
    """abs(claim - exp) < t (or <=, or abs(exp - claim)) exactly as Python evaluates it: int - int exactly,
    a float in the subtraction makes it a float one (rounded), and the comparison is exact whatever the types."""
    op, t, flipped = bound
    if type(claim) not in (int, float):
        return False
    try:
        d = abs(exp - claim) if flipped else abs(claim - exp)
    except OverflowError:  # an int too large for a float in a float subtraction: Python's assert raises
        return False
    return d < t if op == "<" else d <= t


def tuples_as_lists(claim):
    """A well-formed claim with every tuple in it (through lists and tuples) read as a list: APPS's harness turns a
    returned tuple into a list before comparing, and its expected values are JSON, which has no tuples."""
    if type(claim) is dict and "$tuple" in claim:
        claim = claim["$tuple"]
    return [tuples_as_lists(x) for x in claim] if type(claim) is list else claim


def truth(claim) -> bool:
    """Python's truth of a well-formed claimed value: a container is true when it has something in it."""
    if type(claim) is dict:
        return len(next(iter(claim.values()))) > 0
    return bool(claim)
