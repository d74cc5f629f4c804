"""Cleaning up after a sandboxed program (rlpost/sandbox/: cleanup.py, hostdir.py, slots.py): the
removal never follows a link or leaves the tree, lists each directory once, stops at its
deadline, acts with the program's own uid; the stale-sandbox sweep touches only what its slot's
registry lists, never what anyone planted in /tmp, and never judges liveness by pid.

Trees are built on /dev/shm where there is one: what is tested is what the removal does, and on
this machine's ext4 each rmdir costs ~3.7 ms (the disk's discard), which would measure the disk.
"""

import glob
import json
import os
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from rlpost.sandbox import Limits, cleanup, hostdir, isolation, run, run_python, slots

ROOT = os.geteuid() == 0
SHM = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
OTHER_UID = 54321  # an unprivileged uid that is neither ours nor a sandbox's
FAST = Limits(wall_s=3.0, cpu_s=2, memory_mb=128, max_disk_mb=16, max_processes=16)
needs_root = pytest.mark.skipif(not ROOT, reason="acting as another uid needs root")


@pytest.fixture(autouse=True)
def rlimits_as_root_allowed(monkeypatch):
    monkeypatch.setenv(run.ALLOW_ROOT_ENV, "1")


@pytest.fixture
def area(request):
    """An empty folder on /dev/shm where there is one, else pytest's tmp_path."""
    if SHM is None:
        yield str(request.getfixturevalue("tmp_path"))
        return
    d = tempfile.mkdtemp(dir=SHM, prefix="rlpost-test-")
    yield d
    subprocess.run(["rm", "-rf", d])


def outside(area: str) -> str:
    """A folder beside the tree, with a file the removal must never touch."""
    path = os.path.join(area, "outside")
    os.makedirs(os.path.join(path, "sub"))
    with open(os.path.join(path, "sub", "keep.txt"), "w") as f:
        f.write("keep")
    return path


def untouched(path: str) -> bool:
    return open(os.path.join(path, "sub", "keep.txt")).read() == "keep"


# --- the removal itself ---------------------------------------------------------------------------


def test_any_depth_unreadable_and_linked_trees_go_and_nothing_outside(area):
    out = outside(area)
    top = os.path.join(area, "t")
    os.mkdir(top)
    fd = os.open(top, os.O_RDONLY)
    for _ in range(3000):  # deeper than the recursion limit, than PATH_MAX by name, and than MAX_OPEN descriptors
        os.mkdir("dd", dir_fd=fd)
        os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
        os.symlink(out, "link", dir_fd=fd)  # a link to a folder outside, at every level
        nxt = os.open("dd", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.symlink(os.path.join(out, "sub", "keep.txt"), "file_link", dir_fd=fd)
    os.close(fd)
    os.chmod(os.path.join(top, "dd"), 0)  # unreadable near the top
    os.chmod(os.path.join(top, "dd", "dd"), 0o500)  # and unwritable below it
    cleanup.remove_tree(top)
    assert not os.path.exists(top) and untouched(out) and os.listdir(out) == ["sub"]


def test_each_directory_is_listed_once(area, monkeypatch):
    """Linear: 3000 directories side by side, each holding a file, and a 200-deep chain are listed
    once each, the chain's empty end not at all (one rmdir): 1 + 3000 + 199 listings. The
    removal this replaced listed a directory again after each subdirectory: ~20k empty
    directories took it 25-36 s."""
    top = os.path.join(area, "t")
    os.mkdir(top)
    for i in range(3000):
        os.mkdir(os.path.join(top, f"d{i}"))
        open(os.path.join(top, f"d{i}", "f"), "w").close()
    os.makedirs(os.path.join(top, *["c"] * 200))
    listed = []
    real = os.scandir
    monkeypatch.setattr(cleanup.os, "scandir", lambda fd: listed.append(fd) or real(fd))
    cleanup.remove_tree(top)
    assert len(listed) == 1 + 3000 + 199 and not os.path.exists(top)


def test_a_directory_moved_out_while_it_is_removed_never_leads_outside(area, monkeypatch):
    """The program (or a daemon of it) moves a directory of the tree out, to a folder with files of
    someone else's, while the removal is inside it. A removal that climbed back through '..' went
    on in that folder and deleted it; by descriptors, nothing outside is reached."""
    out = outside(area)
    top = os.path.join(area, "t")
    os.makedirs(os.path.join(top, "a", "b", "c"))
    real = cleanup._clear

    def move_then_clear(fd, clock):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/a/b"):
            os.rename(os.path.join(top, "a"), os.path.join(out, "a"))  # while we hold b open
        return real(fd, clock)

    monkeypatch.setattr(cleanup, "_clear", move_then_clear)
    cleanup.remove_tree(top)
    assert not os.path.exists(top) and untouched(out)
    assert sorted(os.listdir(out)) == ["a", "sub"] and os.listdir(os.path.join(out, "a")) == []


def test_a_directory_swapped_for_a_link_is_unlinked_never_followed(area, monkeypatch):
    out = outside(area)
    top = os.path.join(area, "t")
    os.makedirs(os.path.join(top, "x", "y"))
    real = cleanup._clear

    def swap_then_clear(fd, clock):
        names = real(fd, clock)
        if "x" in names:  # listed as a directory; now a link to the outside folder
            os.rename(os.path.join(top, "x"), os.path.join(area, "x-moved"))
            os.symlink(out, os.path.join(top, "x"))
        return names

    monkeypatch.setattr(cleanup, "_clear", swap_then_clear)
    cleanup.remove_tree(top)
    assert not os.path.exists(top) and untouched(out) and sorted(os.listdir(out)) == ["sub"]
    with pytest.raises(OSError):  # and a link in place of the top itself is refused
        os.symlink(out, os.path.join(area, "top-link"))
        cleanup.remove_tree(os.path.join(area, "top-link"))
    assert untouched(out)


def test_the_removal_stops_at_its_deadline(area):
    top = os.path.join(area, "t")
    os.mkdir(top)
    for i in range(20000):
        os.mkdir(os.path.join(top, f"d{i}"))
    # A deadline already past: the removal stops at its first look at the clock (every CHECK_EVERY entries). A
    # deadline 50 ms ahead was a race on a quiet machine, which removed all 20,000 in time (a full-suite run).
    t0 = time.monotonic()
    with pytest.raises(cleanup.Overdue):
        cleanup.remove_tree(top, deadline=time.monotonic() - 1.0)
    assert time.monotonic() - t0 < 1.0 and os.path.isdir(top)  # stopped, the rest left for later
    assert len(os.listdir(top)) >= 20000 - cleanup.CHECK_EVERY


@needs_root
def test_as_root_the_removal_has_the_programs_rights_only(area):
    """A tree of the sandbox's uid with a root-owned folder in it (standing for anything the
    program could not delete itself): removed as that uid, the root-owned folder stays, and the
    failure is reported, never done as root."""
    uid = slots.SLOT_UID_BASE + 2000
    top = os.path.join(area, "t")
    os.makedirs(os.path.join(top, "mine", "deep"))
    os.makedirs(os.path.join(top, "roots"))
    with open(os.path.join(top, "roots", "keep.txt"), "w") as f:
        f.write("keep")
    os.chmod(area, 0o755)
    for path in (top, os.path.join(top, "mine"), os.path.join(top, "mine", "deep")):
        os.chown(path, uid, uid)
    with pytest.raises(OSError, match="Permission denied"):
        cleanup.remove_tree_as(top, uid, 10.0, python=run.launch.python_path())
    assert (open(os.path.join(top, "roots", "keep.txt")).read() == "keep"
            and not os.path.exists(os.path.join(top, "mine")))


# --- the rlimits working directory, end to end --------------------------------------------------

MANY_DIRS = ("import os\nn = 0\ntry:\n    while n < 20000:\n        os.mkdir(f'd{n}'); n += 1\nexcept OSError:\n"
             "    pass\nos.chmod('.', 0)\nprint(n)")


@pytest.mark.parametrize("mount", [True, False, None], ids=["tmpfs-mount", "plain-dir", "bwrap"])
def test_twenty_thousand_directories_cost_the_next_run_nothing(monkeypatch, mount):
    """A program makes 20000 directories (where nothing caps them first), then locks its working
    directory (chmod 000). Its run ends within its limit, leaves nothing, and the next run on its
    slot starts clean. (The removal this replaced took 25-36 s for ~20k on a 2 s limit.) Root: a tmpfs of its own,
    capped at INODES_PER_MB per MiB and gone in one unmount; else (and as root where mounts are refused) a plain
    directory removed as the program's uid, by descriptors. Under bubblewrap the directory is the sandbox's own
    tmpfs."""
    backend = "bwrap" if mount is None else "rlimits"
    if backend == "bwrap" and not run.bwrap_works():
        pytest.skip("bubblewrap is missing or cannot create namespaces here")
    if mount and not hostdir.can_mount():
        pytest.skip("this process may not mount a tmpfs (needs root, and a container that allows it)")
    if mount is False:
        monkeypatch.setattr(hostdir, "_mounts_refused", [True])
        if SHM is not None:
            monkeypatch.setattr(tempfile, "tempdir", SHM)
    t0 = time.monotonic()
    res = run_python(MANY_DIRS, backend=backend, parallel=1, limits=Limits(wall_s=5.0, cpu_s=3, max_disk_mb=16))
    seconds = time.monotonic() - t0
    made = int(res.stdout)
    assert res.status == "ok" and res.cleanup == "" and seconds < res.wall_s + 3.0, (res, seconds)
    assert made == (16 * hostdir.INODES_PER_MB - 2 if mount else 20000)  # the tmpfs root and main.py use two
    assert not os.listdir(hostdir.work_root()) or all(not n.startswith("0-") for n in os.listdir(hostdir.work_root()))
    assert run_python("print('next')", backend=backend, parallel=1, limits=FAST).stdout == "next\n"


def test_a_removal_that_fails_is_finished_by_the_next_holder_of_the_slot(monkeypatch):
    real, failed = hostdir.remove, []

    def broken(entry, seconds):
        failed.append(entry)
        raise cleanup.Overdue("removal past its deadline")

    monkeypatch.setattr(hostdir, "remove", broken)
    res = run_python("open('x', 'w').write('y')", backend="rlimits", parallel=1, limits=FAST)
    assert "Overdue" in res.cleanup and os.path.isdir(failed[0]["path"])
    monkeypatch.setattr(hostdir, "remove", real)
    assert run_python("print(1)", backend="rlimits", parallel=1, limits=FAST).cleanup == ""
    assert not os.path.exists(failed[0]["path"])  # the registry named it to the next holder


# --- the stale sweep: only what the registry lists ----------------------------------------------


@needs_root
def test_planted_look_alikes_and_other_namespaces_runs_are_never_touched(area):
    """Another uid plants what the old sweep took for a dead worker's leftovers: a folder named
    like a working directory of a pid that does not exist here (its files), and a link of that
    name to a folder of ours (the old sweep chmod-ed through it as root). A cgroup named like a
    run of such a pid stands for a live worker in another pid namespace. None is touched."""
    dead = 4_000_000  # above pid_max: no process here has it, which is all the old sweep checked
    out = outside(area)
    os.chmod(out, 0o750)
    plant = os.path.join(tempfile.gettempdir(), f"rlpost-sbx-{dead}-planted")
    link = os.path.join(tempfile.gettempdir(), f"rlpost-sbx-{dead}-link")
    subprocess.run(["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", "sh", "-c",
                    f"mkdir {plant} && echo theirs > {plant}/file && ln -s {out} {link}"], check=True)
    host = isolation.cgroup_host()
    cgroups = ([os.path.join(b, f"rlpost-{dead}-0-live") for b in dict.fromkeys((host.pids, host.memory)) if b] if host
               else [])
    try:
        for path in cgroups:
            os.mkdir(path)
        for backend in ("bwrap", "rlimits") if run.bwrap_works() else ("rlimits",):
            assert run_python("print(1)", backend=backend, limits=FAST).stdout == "1\n"
        assert open(os.path.join(plant, "file")).read() == "theirs\n" and os.readlink(link) == out
        assert stat.S_IMODE(os.stat(out).st_mode) == 0o750 and untouched(out)
        assert all(os.path.isdir(p) for p in cgroups)
    finally:
        for path in cgroups:
            os.rmdir(path)
        subprocess.run(["rm", "-rf", plant, link])


def test_the_registry_lists_only_our_own_and_is_private(area):
    folder = slots.slot_dir()
    st = os.lstat(folder)
    assert st.st_uid == os.geteuid() and not st.st_mode & 0o077  # no other uid can write (or read) a registry
    root = hostdir.work_root()
    assert not os.lstat(root).st_mode & 0o022
    with pytest.raises(OSError, match="not a working directory of ours"):  # an entry naming anything else
        hostdir.remove({"kind": "workdir", "path": outside(area), "uid": OTHER_UID}, 1.0)
    for path in ("/sys/fs/cgroup", os.path.join(area, "rlpost-slot0-x"), "/sys/fs/cgroup/rlpost-x/../../../tmp"):
        with pytest.raises(OSError, match="not a run cgroup"):
            isolation.remove_stale_cgroup(path)
    assert untouched(os.path.join(area, "outside"))
    # a work root under another TMPDIR is ours only if no other uid can write it
    other_root = os.path.join(area, f"rlpost-work-{os.geteuid()}")
    os.makedirs(os.path.join(other_root, "0-x", "sub"))
    os.chmod(other_root, 0o777)
    with pytest.raises(OSError, match="not a working directory of ours"):
        hostdir.remove({"kind": "workdir", "path": os.path.join(other_root, "0-x"), "uid": os.geteuid()}, 1.0)
    os.chmod(other_root, 0o700)
    hostdir.remove({"kind": "workdir", "path": os.path.join(other_root, "0-x"), "uid": os.geteuid()}, 1.0)
    assert os.listdir(other_root) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="making cgroups needs root")
def test_a_cgroup_left_under_another_process_trees_cgroup_is_removed_and_a_gone_one_is_done():
    """Slots are host-wide, so the last holder may have been a worker in another cgroup (another
    service, another job's tree): its run cgroup sits under that cgroup, not ours. The next holder
    still removes it, and an entry whose folder is already gone is done rather than listed forever
    (every later run on the slot would stop to clear it)."""
    host = isolation.cgroup_host()
    if host is None:
        pytest.skip("no cgroup to make run cgroups in")
    ours = {host.memory, host.pids, host.kill, host.cpu}
    points = [point for *_, point in isolation.cgroup_mounts() if point not in ours and os.access(point, os.W_OK)]
    if not points:
        pytest.skip("every cgroup mount here is one of our bases")
    foreign = os.path.join(points[0], "rlpost-slot0-foreign")
    try:
        os.mkdir(foreign)
    except OSError as e:  # a hierarchy's root a container may not write
        pytest.skip(f"cannot make a cgroup under {points[0]}: {e}")
    try:
        isolation.remove_stale_cgroup(foreign)
        assert not os.path.exists(foreign)
    finally:
        if os.path.exists(foreign):
            os.rmdir(foreign)
    isolation.remove_stale_cgroup(os.path.join(points[0], "no-such-tree", "rlpost-slot0-gone"))


def test_leftovers_of_a_dead_holder_are_removed_by_the_next_one():
    """What a holder listed and did not remove (it died): a working directory with files in it and
    a cgroup. The next holder of the slot removes exactly those."""
    slot = slots.acquire_slot(1, uid_block=1)
    try:
        workdir = os.path.join(hostdir.work_root(), f"{slot.index}-deadholder")
        entries = [{"kind": "workdir", "path": workdir, "uid": slot.uid, "mount": False}]
        host = isolation.cgroup_host()
        if host is not None:
            entries.append({"kind": "cgroup", "path": os.path.join(host.pids, f"rlpost-slot{slot.index}-deadholder")})
        for entry in entries:
            slots.record(slot, add=entry)
        os.makedirs(os.path.join(workdir, "a", "b"))
        open(os.path.join(workdir, "a", "f"), "w").close()
        if ROOT:
            for path in glob.glob(workdir + "/**", recursive=True):
                os.chown(path, slot.uid, slot.uid)
        if host is not None:
            os.mkdir(entries[1]["path"])
        assert slots.read_registry(slot.fd) == entries
    finally:
        slots.release_slot(slot, clean=False)
    assert run_python("print(1)", backend="rlimits", parallel=1, limits=FAST).cleanup == ""
    assert not any(os.path.exists(e["path"]) for e in entries)


def test_a_squatted_old_work_root_name_costs_no_reward(monkeypatch, tmp_path, request):
    """Any local user could make the old fixed name {TMPDIR}/rlpost-work-{uid} first, and every
    rlimits sample then scored 0 (the check refused it, rightly). The root is now a private name
    nobody can foresee, recorded in the slot directory: grading pays, and the squatted folder is
    left as it was."""
    from rlpost.envs.grading import grade

    temp, folder = Path(tempfile.mkdtemp(prefix="rlpost-test-")), tmp_path / "slots"  # temp: like /tmp, reachable
    os.chmod(temp, 0o755)  # by the sandbox's uid (pytest's tmp_path is not)
    request.addfinalizer(lambda: subprocess.run(["rm", "-rf", str(temp)]))
    folder.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setattr(slots, "slot_dir", lambda: str(folder))  # no record yet: the root is made here
    monkeypatch.setattr(hostdir, "_roots", {})
    squat = temp / f"rlpost-work-{os.geteuid()}"
    squat.mkdir()
    os.chmod(squat, 0o777)
    if ROOT:
        os.chown(squat, OTHER_UID, OTHER_UID)
    tests = [{"stdin": "3\n", "stdout": "6"}, "assert double(4) == 8"]
    program = "def double(x):\n    return 2 * x\nif __name__ == '__main__':\n    print(double(int(input())))"
    reward, info = grade(program, tests, FAST, "rlimits", 1, allow_root=True)
    assert (reward, info["statuses"]) == (1.0, ["pass", "pass"]), info
    root = hostdir.work_root()
    st = os.lstat(root)
    assert os.path.dirname(root) == str(temp) and os.path.basename(root).startswith(f"rlpost-work-{os.geteuid()}-")
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == (0o711 if ROOT else 0o700)
    assert json.loads((folder / hostdir.RECORD).read_text()) == {str(temp): root} and os.listdir(squat) == []
    hostdir._roots.clear()  # another process of ours reads the record
    assert hostdir.work_root() == root
    os.chmod(root, 0o777)  # a recorded root that stopped being private is never used again
    assert hostdir.work_root() not in (root, str(squat))
    assert grade(program, tests, FAST, "rlimits", 1, allow_root=True)[0] == 1.0
    os.chmod(root, 0o700)


def as_uid(uid: int, env: dict, fn) -> tuple[int, str]:
    """fn() run in a forked child as `uid` with `env` as its environment: (exit status, what it printed
    or the error's text). A fork, not a new interpreter: that one could not be read by another uid."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            os.environ.clear()
            os.environ.update(env)
            tempfile.tempdir = None  # gettempdir() reads TMPDIR again
            os.setgid(uid)
            os.setuid(uid)
            text = str(fn())
        except BaseException as e:  # noqa: BLE001 - the parent reads what went wrong
            code, text = 1, str(e)
        os.write(w, text.encode())
        os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), text


@needs_root
def test_a_user_whose_tmp_slot_directory_was_taken_first_uses_its_runtime_directory():
    """Not root, the slot directory had a fixed name in /tmp, so any other user could make it first and
    this uid could never sandbox anything. A user with a runtime directory (XDG_RUNTIME_DIR, its own)
    keeps the slot directory there; without one, the taken name is refused in one line naming it."""
    nobody = 65534
    base = Path(tempfile.mkdtemp(prefix="rlpost-test-"))  # pytest's tmp_path is not reachable by another uid
    try:
        check_runtime_directory(base, nobody)
    finally:
        subprocess.run(["rm", "-rf", str(base)])


def check_runtime_directory(base: Path, nobody: int):
    tmp, runtime = base / "tmp", base / "run-user"
    tmp.mkdir()
    tmp.chmod(0o1777)
    runtime.mkdir(mode=0o700)
    os.chown(runtime, nobody, nobody)
    base.chmod(0o755)
    (tmp / f"rlpost-sandbox-{nobody}").mkdir(mode=0o755)  # made first by root: not nobody's
    code, out = as_uid(nobody, {"TMPDIR": str(tmp), "XDG_RUNTIME_DIR": str(runtime)}, slots.slot_dir)
    assert (code, out) == (0, str(runtime / "rlpost-sandbox"))
    assert os.stat(runtime / "rlpost-sandbox").st_uid == nobody
    code, out = as_uid(nobody, {"TMPDIR": str(tmp)}, slots.slot_dir)
    assert code == 1 and out == f"{tmp}/rlpost-sandbox-{nobody}: not a private directory of uid {nobody}; remove it"
