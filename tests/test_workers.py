"""The one worker pool (workers.py), its rules tested once, against a worker that misbehaves on
request (tests/toy_workers.py): hangs past its deadline, dies mid-reply, writes garbage or frames
nobody asked for, floods its output, forks children that outlive it, fails at import. The
environment and reward handlers keep only their own tests (tests/envs, tests/rewards)."""

import ast
import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlpost.types.errors import ConfigError
from rlpost.workers import WorkerPool

PATHS = tuple(p for p in sys.path if p)  # tests/ among them: the workers import toy_workers from there
SRC = Path(__file__).resolve().parents[1] / "src" / "rlpost"


def pool(path: str = "ok", timeout_s: float = 10.0, **kwargs) -> WorkerPool:
    return WorkerPool("toy_workers", path, timeout_s, what="toy worker", key="task.toy", import_paths=PATHS, **kwargs)


def state(pid: int) -> str | None:
    """The process's state letter ('Z': a zombie), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except OSError:
        return None


def pids_in(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()]


def test_calls_come_back_in_order_from_parallel_workers():
    p = pool(workers=2)
    try:
        out = p.run([{"op": "sleep", "value": i / 1000} for i in range(12)])
        assert [o[:2] for o in out] == [("ok", i / 1000) for i in range(12)]
        assert len(p.pids()) == 2 and {o[2] for o in out} <= set(p.pids()) and p.hello == "toy ok"
    finally:
        p.close()
    assert not any(state(pid) for pid in p.pids() + [o[2] for o in out])


def test_a_call_past_its_deadline_is_killed_with_what_it_started_and_a_fresh_worker_serves_the_next(tmp_path):
    p = pool(timeout_s=2.0, workers=1)
    try:
        first = p.pids()
        out = p.run([{"op": "fork", "pids": str(tmp_path / "daemon"), "daemon": True, "then": "hang"},
                     {"op": "fork", "pids": str(tmp_path / "child"), "daemon": False, "then": "hang"},
                     {"op": "echo", "value": 1}])
        assert out[:2] == [("timeout",), ("timeout",)] and out[2][:2] == ("ok", 1) and out[2][2] not in first
    finally:
        p.close()
    started = pids_in(tmp_path / "daemon") + pids_in(tmp_path / "child")
    assert len(started) == 2 and not any(state(pid) not in (None, "Z") for pid in started)


def test_a_daemon_started_by_a_call_that_returned_is_gone_when_the_pool_closes(tmp_path):
    # A double-forked setsid() daemon leaves the worker's session and group; the worker, its
    # subreaper, still has it as a descendant, and closing kills it.
    p = pool()
    try:
        out = p.run([{"op": "fork", "pids": str(tmp_path / "d"), "daemon": True, "then": "reply", "value": 2}])
        assert out[0][:2] == ("ok", 2)
        (daemon,) = pids_in(tmp_path / "d")
        assert state(daemon) not in (None, "Z")
    finally:
        p.close()
    assert state(daemon) in (None, "Z")


def test_what_a_call_orphans_is_reaped_and_a_child_it_keeps_keeps_its_status():
    # The worker is a child subreaper: a shell's background job outliving the shell becomes its child.
    # Unreaped, each was a zombie for the rest of the run (60 reward calls running `sh -c 'cmd &'`: 60 zombies,
    # until the pid limit). Its own children (subprocess, os.posix_spawn, os.fork, multiprocessing's spawn) exit
    # at once and are left for a later call, past REAP_EVERY_S: their exit statuses are still theirs to read.
    from rlpost.wire import REAP_EVERY_S

    p = pool(workers=1)
    try:
        assert p.run([{"op": "keep"}, {"op": "orphan", "value": 30}])[1][:2] == ("ok", 30)
        time.sleep(2 * REAP_EVERY_S + 0.5)
        (zombies,), (codes,) = (p.run([{"op": op}])[0][1:2] for op in ("zombies", "wait_kept"))
        assert zombies == 4 and codes == [3, 5, 6, 8]  # the four kept ones, exited, not yet waited for
        assert p.run([{"op": "zombies"}])[0][1] == 0
    finally:
        p.close()


def test_a_worker_dying_mid_reply_is_a_death_with_its_exit_code():
    p = pool()
    try:
        out = p.run([{"op": "die_mid_reply"}, {"op": "echo", "value": 3}])
    finally:
        p.close()
    assert out[0] == ("died", "the toy worker exited with code 5")
    assert out[1][:2] == ("ok", 3)


@pytest.mark.parametrize("op,why", [
    ("garbage", "the toy worker sent garbage (ProtocolError: bad frame header b'this is ')"),
    ("huge", "the toy worker sent garbage (ProtocolError: bad frame header b'RLPV\\x01\\x00\\x00\\x10')"),
    ("class", "the toy worker's reply was refused: the reply holds a toy_workers.Secret object; only plain values "
              "are accepted"),
])
def test_garbage_on_the_pipe_ends_the_worker_not_the_pool(op, why):
    p = pool()
    try:
        out = p.run([{"op": op}, {"op": "error"}, {"op": "echo", "value": 4}])
    finally:
        p.close()
    assert out[0] == ("died", why)
    assert out[1] == ("error", "RuntimeError: broken", "Traceback ...") and out[2][:2] == ("ok", 4)
    assert "toy_workers" not in sys.modules  # the class was never imported to unpickle it


def test_a_reply_cut_short_runs_into_the_deadline():
    p = pool(timeout_s=1.0)
    try:
        assert p.run([{"op": "slow_frame"}, {"op": "echo", "value": 5}])[0] == ("timeout",)
    finally:
        p.close()


def test_a_frame_nobody_asked_for_never_answers_the_next_call(tmp_path):
    p = pool(workers=1)
    try:
        (first,) = p.run([{"op": "stale", "value": 1, "sign": str(tmp_path / "sent")}])
        assert first[0] == "died" or first[:2] == ("ok", 1)  # both frames in one read: that call died
        while not (tmp_path / "sent").exists():
            time.sleep(0.01)
        assert p.run([{"op": "echo", "value": 2}])[0][:2] == ("ok", 2)  # not the stale frame
    finally:
        p.close()


def test_a_worker_that_exits_while_idle_costs_no_call():
    p = pool(workers=1)
    try:
        (first,) = p.run([{"op": "exit_after_reply", "value": 1}])
        try:
            select.select([os.pidfd_open(first[2])], [], [])  # until it has ended, every thread of it
        except ProcessLookupError:  # seen ended by the pool already, and reaped
            pass
        (second,) = p.run([{"op": "echo", "value": 2}])
        assert first[:2] == ("ok", 1) and second[:2] == ("ok", 2) and second[2] != first[2]
    finally:
        p.close()


def test_a_flood_of_output_goes_to_the_log_and_the_replies_stay_whole(tmp_path):
    log = tmp_path / "workers.log"
    p = pool(log_path=log)
    try:
        out = p.run([{"op": "flood", "value": 8}, {"op": "echo", "value": 6}])
    finally:
        p.close()
    assert [o[:2] for o in out] == [("ok", 8), ("ok", 6)] and log.stat().st_size == 2 * 6 * ((8 << 20) // 6)


def test_past_its_cpu_limit_a_worker_dies_naming_the_limit():
    p = pool(timeout_s=60.0)
    try:
        out = p.run([{"op": "spin"}, {"op": "echo", "value": 7}])
    finally:
        p.close()
    assert out[0] == ("died", "the toy worker killed by SIGXCPU (over its CPU limit)")
    assert out[1][:2] == ("ok", 7)


def test_a_runaway_allocation_fails_inside_the_worker():
    p = pool(memory_mb=1024)
    try:
        out = p.run([{"op": "allocate", "value": 2048}, {"op": "allocate", "value": 64}])
    finally:
        p.close()
    assert out[0][0] == "error" and out[0][1].startswith("MemoryError") and out[1][:2] == ("ok", 64)


@pytest.mark.parametrize("path,why", [
    ("exit3", r"the toy worker exited with code 3"),
    ("raise", r"ValueError: no such thing"),
    ("garbage", r"the toy worker sent garbage \(ProtocolError: bad frame header b'garbage '\)"),
    ("slow", r"importing it took more than 0 s"),
])
def test_a_worker_that_cannot_start_is_one_config_error_line_before_anything_runs(path, why):
    with pytest.raises(ConfigError, match=rf"^task.toy: cannot import '{path}' \({why}\)$"):
        pool(path, grace_s=0.3 if path == "slow" else 20.0)


def test_after_three_failed_starts_in_a_row_the_waiting_calls_fail(tmp_path):
    p = pool(f"once:{tmp_path / 'started'}", workers=1)  # every start after the first exits at import
    try:
        out = p.run([{"op": "garbage"}, {"op": "echo", "value": 1}, {"op": "echo", "value": 2}])
    finally:
        p.close()
    assert out[0][0] == "died" and out[1:] == [("died", "no toy worker could start (3 tries)")] * 2


def test_a_hang_costs_its_deadline_never_the_start_up_grace():
    # Each killed worker's successor gets the grace once, to start; a call's deadline never includes
    # it. Were it added to a call's, the four calls would take 20 minutes, not seconds.
    p = pool(timeout_s=0.5, workers=1, grace_s=600.0)
    t0 = time.monotonic()
    try:
        out = p.run([{"op": "hang"}, {"op": "hang"}, {"op": "echo", "value": 1}, {"op": "echo", "value": 2}])
    finally:
        p.close()
    assert out[:2] == [("timeout",), ("timeout",)] and [o[1] for o in out[2:]] == [1, 2]
    assert time.monotonic() - t0 < 60


RUN_IN_A_CHILD = """import json, os, sys, ctypes
sys.path[:0] = json.loads(sys.argv[1])
from rlpost.workers import WorkerPool
"""


def test_workers_die_with_their_parent(tmp_path):
    # A parent that is SIGKILLed (no clean-up runs) while its worker hangs in a call: the worker goes too.
    code = RUN_IN_A_CHILD + (
        "p = WorkerPool('toy_workers', 'ok', 60, what='toy worker', key='k', import_paths=json.loads(sys.argv[1]))\n"
        "print(p.pids()[0], flush=True)\n"
        "p.run([{'op': 'hang', 'value': sys.argv[2]}])\n")
    parent = subprocess.Popen([sys.executable, "-c", code, json.dumps(PATHS), str(tmp_path / "in_call")],
                              stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    while not (tmp_path / "in_call").exists():
        time.sleep(0.02)
    parent.kill()
    parent.wait()
    for _ in range(200):  # waits for the event, up to 10 s
        if state(worker) in (None, "Z"):
            break
        time.sleep(0.05)
    assert state(worker) in (None, "Z"), "the worker outlived its parent"


@pytest.mark.slow  # a few seconds of worker starts
def test_under_a_child_subreaper_every_process_a_kill_orphans_is_reaped(tmp_path):
    # Where the pool's process is a child subreaper (a supervisor makes it one), whatever a killed
    # worker leaves is handed to it: a child in the worker's group after the worker exited, the
    # daemons killed with a hung worker or at close. The pool reaps them; /proc shows none of its
    # children left. (A daemon in a session of its own, left by a worker that then exits by itself,
    # is beyond any kill's reach: workers.py says so.)
    code = RUN_IN_A_CHILD + (
        "assert ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER\n"
        "d = sys.argv[2]\n"
        "p = WorkerPool('toy_workers', 'ok', 2.0, what='toy worker', key='k', import_paths=json.loads(sys.argv[1]))\n"
        "out = p.run([{'op': 'fork', 'pids': d + '/a', 'daemon': False, 'then': 'exit'},\n"
        "             {'op': 'fork', 'pids': d + '/b', 'daemon': True, 'then': 'hang'},\n"
        "             {'op': 'fork', 'pids': d + '/c', 'daemon': False, 'then': 'hang'},\n"
        "             {'op': 'die_mid_reply'},\n"
        "             {'op': 'fork', 'pids': d + '/d', 'daemon': True, 'then': 'reply'}])\n"
        "p.close()\n"
        "me, kids = os.getpid(), {}\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        fields = open(f'/proc/{pid}/stat').read().rpartition(')')[2].split()\n"
        "    except OSError:\n"
        "        continue\n"
        "    if int(fields[1]) == me:\n"
        "        kids[pid] = fields[0]\n"
        "print(json.dumps({'outcomes': [o[0] for o in out], 'children': kids}))\n")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(PATHS), str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result == {"outcomes": ["died", "timeout", "timeout", "died", "ok"], "children": {}}
    started = [pid for name in "abcd" for pid in pids_in(tmp_path / name)]
    assert len(started) == 4 and not any(state(pid) not in (None, "Z") for pid in started)


def test_one_place_lists_processes():
    # wire.processes: the one scan of /proc (kill_tree, the reapers, the sandbox's kills all read it)
    found = {f.relative_to(SRC).as_posix() for f in SRC.rglob("*.py")
             if re.search(r"listdir\(\s*['\"]/proc['\"]", f.read_text())}
    assert found == {"wire.py"}, found


def test_one_place_starts_worker_processes():
    # docs/design.md: one worker pool. Only workers.py starts processes that run rlpost's code;
    # sandbox/ starts the model's programs (and the helper that removes what they left), never a worker.
    spawn = {"Popen", "run", "call", "check_call", "check_output", "fork", "forkpty", "posix_spawn", "posix_spawnp",
             "spawnv", "spawnve", "execv", "execve", "Process", "Pool", "ProcessPoolExecutor"}
    modules = {"subprocess", "os", "multiprocessing", "concurrent.futures"}
    found = set()
    for f in SRC.rglob("*.py"):
        tree = ast.parse(f.read_text())
        imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                    and n.module in modules for a in n.names}
        for node in ast.walk(tree):
            fn = node.func if isinstance(node, ast.Call) else None
            if (isinstance(fn, ast.Attribute) and fn.attr in spawn and isinstance(fn.value, ast.Name)
                    and fn.value.id in modules | {"mp"}) or (isinstance(fn, ast.Name) and fn.id in spawn & imported):
                found.add(f.relative_to(SRC).parts[0] if f.parent != SRC else f.name)
    assert found == {"workers.py", "sandbox"}, found


def test_a_dead_worker_names_its_log_only_when_it_wrote_one(tmp_path):
    from rlpost.workers import WorkerPool

    pool_ = WorkerPool.__new__(WorkerPool)
    pool_.log_path = str(tmp_path / "verifier.log")
    assert pool_.output_hint() == " (it wrote no output)"  # no file: the message names none
    (tmp_path / "verifier.log").write_text("Traceback ...\n")
    assert pool_.output_hint() == f" (its output is in {tmp_path / 'verifier.log'})"
    pool_.log_path = "/dev/null"
    assert pool_.output_hint() == ""
