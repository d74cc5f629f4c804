"""The code verifier and its sandbox: honest programs score what they earn, hostile ones are
contained every time, score 0, and leave this test process (and the machine) unharmed.

Sandbox tests run under both backends: bwrap (skipped where it cannot run) and the rlimit
fallback, forced through RLPOST_SANDBOX. Where the fallback lacks a guarantee by design
(network, filesystem isolation...) the test is skipped there with a reason naming it; under
bwrap every guarantee is asserted. The fork bomb only runs after a benign check (100 sleeping
children) has shown that the process cap holds.
"""

import os
import shutil
import socket
import tempfile
import time
import uuid

import pytest

from rlpost.envs import sandbox
from rlpost.envs.code import TEMPLATES, build_splits, extract_program, make_row, score
from rlpost.envs.sandbox import Limits, guarantees, run_python
from rlpost.rewards.runner import VerifierRunner

ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(10, 1) == 11", "assert add(7, 7) == 14"]
FAST = {"wall_s": 2.0, "cpu_s": 1, "memory_mb": 256}
ADD_ROW = {"tests": ADD_TESTS, "limits": FAST}


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\n"


@pytest.fixture(params=["bwrap", "rlimit"])
def backend(request, monkeypatch):
    """Run the test under one backend; score() picks it up from RLPOST_SANDBOX."""
    if request.param == "bwrap" and not sandbox.bwrap_works():
        pytest.skip("bubblewrap is missing or cannot create its namespaces on this machine")
    monkeypatch.setenv("RLPOST_SANDBOX", request.param)
    return request.param


def require(backend: str, guarantee: str) -> None:
    """Assert the guarantee under bwrap; skip, naming it, where the fallback lacks it."""
    if backend == "bwrap":
        assert guarantees("bwrap")[guarantee]
    elif not guarantees(backend)[guarantee]:
        pytest.skip(f"the {backend} fallback does not guarantee {guarantee}")


# --- honest programs --------------------------------------------------------------------------


def test_correct_wrong_and_partial_programs():
    reward, info = score(fenced("def add(a, b):\n    return a + b"), ADD_ROW)
    assert reward == 1.0 and info["passed"] == 4 and info["statuses"] == ["pass"] * 4
    assert info["backend"] in ("bwrap", "rlimit")
    assert score(fenced("def add(a, b):\n    return a - b"), ADD_ROW)[0] == 0.0  # 1-2, 2-2, 10-1, 7-7: none match
    # a < 5 adds, else returns 0: add(1,2)=3 and add(2,2)=4 pass, add(10,1) and add(7,7) fail -> 2/4
    reward, info = score(fenced("def add(a, b):\n    return a + b if a < 5 else 0"), ADD_ROW)
    assert reward == 0.5 and info["statuses"] == ["pass", "pass", "fail", "fail"]
    # one assert raising does not hide the others: 3/4, the second reports its exception name
    row = {"tests": [ADD_TESTS[0], "assert add('a', 1) == 2", *ADD_TESTS[2:]], "limits": FAST}
    reward, info = score(fenced("def add(a, b):\n    return a + b"), row)
    assert reward == 0.75 and info["statuses"][1] == "TypeError"


def test_program_that_does_not_even_run_scores_zero():
    reward, info = score(fenced("def add(a, b)\n    return a + b"), ADD_ROW)
    assert reward == 0.0 and info["statuses"] == ["program:SyntaxError"] * 4
    assert score("I don't know.", ADD_ROW)[0] == 0.0


def test_stdin_stdout_form():
    row = {"tests": [{"stdin": "1 2 3\n", "stdout": "6"}, {"stdin": "5\n-5\n", "stdout": "0\n"},
                     {"stdin": "", "stdout": "0"}], "limits": FAST}
    good = "import sys\nprint(sum(map(int, sys.stdin.read().split())))"
    assert score(fenced(good), row)[0] == 1.0
    reward, info = score(fenced("print(6)"), row)  # right only for the first input
    assert reward == pytest.approx(1 / 3) and info["statuses"] == ["pass", "fail", "fail"]
    # a hang on the first input skips the rest instead of waiting out every wall limit
    reward, info = score(fenced("while True: pass"), {**row, "limits": {"wall_s": 1.0, "cpu_s": 1}})
    assert reward == 0.0 and info["statuses"] == ["timeout", "skipped", "skipped"]


def test_extract_program():
    two = "```python\nx = 1\n```\ntext\n```python\nx = 2\n```\n```bash\nls\n```"
    assert extract_program(two) == "x = 2\n"  # the last python block, not the bash one
    assert extract_program("x = 3") == "x = 3"  # no fence: the whole completion
    assert extract_program("```\nx = 4\n```") == "x = 4\n"  # an untagged fence
    assert extract_program("```py\nx = 5\ny = 6") == "x = 5\ny = 6\n"  # cut off before the closing fence
    assert extract_program("```bash\nrm -rf /\n```") == ""  # fenced, but nothing that is Python


def test_every_template_reference_answer_scores_one():
    for t in TEMPLATES:
        row = make_row(t, t.space[len(t.space) // 2])
        reward, info = score(fenced(row["answer"]), row)
        assert reward == 1.0, (t.name, row["answer"], info)


def test_splits_are_fixed_disjoint_and_cover_every_template():
    train, heldout = build_splits(500, 100, seed=0)
    assert len(train) == 500 and len(heldout) == 100 and heldout == build_splits(10, 100, seed=0)[1]
    prompt = lambda r: r["messages"][-1]["content"]
    assert not {prompt(r) for r in train} & {prompt(r) for r in heldout}
    assert {r["task"] for r in train} == {r["task"] for r in heldout} == {t.name for t in TEMPLATES}
    assert len(TEMPLATES) >= 30 and "```python block" in prompt(train[0])


# --- sandbox basics, both backends ----------------------------------------------------------


def test_basic_run_stdin_files_and_exit_codes(backend):
    res = run_python("import helper\nprint(helper.X, input()[::-1])", stdin="olleh\n", files={"helper.py": "X = 7"})
    assert (res.status, res.stdout, res.backend) == ("ok", "7 hello\n", backend)
    assert run_python("import sys; sys.exit(3)").status == "error"
    assert run_python("raise ValueError('boom')").stderr.rstrip().endswith("ValueError: boom")
    with pytest.raises(ValueError):
        run_python("pass", files={"../escape.py": ""})


def test_throwaway_dir_is_deleted(backend):
    workdirs = lambda: {d for d in os.listdir(tempfile.gettempdir()) if d.startswith("rlpost-sbx-")}
    before = workdirs()
    res = run_python("import os; os.makedirs('a/b'); open('a/b/left.txt', 'w').write('x'); os.chmod('a', 0)\n"
                     "print(os.getcwd())")
    assert res.status == "ok" and workdirs() <= before  # gone, even with a chmod-000 subdirectory
    if backend == "bwrap":
        assert res.stdout == "/sandbox\n"  # the host path is not even visible by name


def test_guarantees_and_fallback_warning():
    assert all(guarantees("bwrap").values())
    fallback = guarantees("rlimit")
    assert fallback["process_count"] and fallback["wall_time"] and not fallback["network_isolated"]
    sandbox._warn_fallback.cache_clear()
    with pytest.warns(RuntimeWarning, match="network_isolated"):
        run_python("pass", backend="rlimit")


# --- hostile programs -------------------------------------------------------------------------


def test_infinite_loop_and_sleep_time_out(backend):
    reward, info = score(fenced("while True:\n    pass"), ADD_ROW)
    assert reward == 0.0 and info["statuses"] == ["timeout"] * 4  # RLIMIT_CPU (1 s), SIGXCPU
    t0 = time.monotonic()
    res = run_python("import time; time.sleep(100)", limits=Limits(wall_s=1))
    assert res.status == "timeout" and time.monotonic() - t0 < 5


def test_memory_bomb(backend):
    reward, info = score(fenced("x = bytearray(10 * 1024**3)  # 10 GB"), ADD_ROW)
    assert reward == 0.0 and info["statuses"] == ["program:MemoryError"] * 4
    res = run_python("blocks = []\nwhile True:\n    blocks.append(bytearray(10**7))", limits=Limits(memory_mb=256))
    assert res.status == "memory"


def test_output_flood_is_capped_and_fast(backend):
    t0 = time.monotonic()
    reward, info = score(fenced("while True:\n    print('x' * 10**6)"), ADD_ROW)
    assert reward == 0.0 and info["statuses"] == ["output_limit"] * 4
    res = run_python("while True:\n    print('x' * 10**6)", limits=Limits(max_output_bytes=1 << 20))
    assert res.status == "output_limit" and len(res.stdout) == 1 << 20
    assert time.monotonic() - t0 < 10


def _live_processes_with(marker: str) -> int:
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                n += marker.encode() in f.read()
        except OSError:
            pass
    return n


def test_fork_bomb_is_capped_and_leaves_nothing_behind(backend):
    # Benign check first: 100 sleeping children must stop at the cap (RLIMIT_NPROC = 32).
    sleepers = ("import os, time\nok = 0\nfor _ in range(100):\n    try:\n        pid = os.fork()\n"
                "    except OSError:\n        continue\n    if pid == 0:\n        time.sleep(3)\n        os._exit(0)\n"
                "    ok += 1\nprint(ok)")
    res = run_python(sleepers, limits=Limits(wall_s=10, max_processes=32, memory_mb=128))
    assert res.status == "ok" and int(res.stdout) < 32, res  # only now is a real fork bomb safe
    marker = f"rlpost-forkbomb-{uuid.uuid4().hex}"  # re-exec so every bomb process carries it in argv
    bomb = ("import os, sys\nBOMB = 'import os\\nwhile True:\\n    try:\\n        os.fork()\\n    except OSError:\\n"
            f"        pass\\n'\nos.execv(sys.executable, [sys.executable, '-c', BOMB, '{marker}'])")
    reward, info = score(fenced(bomb), {"tests": ADD_TESTS, "limits": {"wall_s": 2.0, "memory_mb": 128}})
    assert reward == 0.0 and info["statuses"] == ["timeout"] * 4
    assert _live_processes_with(marker) == 0


def test_network_is_unreachable(backend):
    require(backend, "network_isolated")
    with socket.socket() as listener:  # a service on the host's loopback the program must not reach
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        for host, p in (("1.1.1.1", 53), ("127.0.0.1", port)):
            attack = f"import socket\nsocket.create_connection(({host!r}, {p}), timeout=2)\ndef add(a, b):\n    return a + b"
            reward, info = score(fenced(attack), ADD_ROW)  # add exists only if the connect worked
            assert reward == 0.0 and info["statuses"][0].startswith("program:"), info
        with pytest.raises(BlockingIOError):
            listener.accept()


def test_secrets_outside_are_unreadable(backend):
    require(backend, "fs_read_isolated")
    home = tempfile.mkdtemp()  # a world-readable fake ~/.ssh/id_rsa, so only isolation can hide it
    try:
        os.makedirs(f"{home}/.ssh")
        with open(f"{home}/.ssh/id_rsa", "w") as f:
            f.write("FAKE PRIVATE KEY")
        for p in (home, f"{home}/.ssh", f"{home}/.ssh/id_rsa"):
            os.chmod(p, 0o755 if os.path.isdir(p) else 0o644)
        targets = [f"{home}/.ssh/id_rsa", os.path.expanduser("~/.ssh/id_rsa"), "/etc/shadow", "/etc/passwd"]
        attack = (f"import os\nleaked = []\nfor p in {targets!r}:\n    try:\n        leaked.append(open(p).read())\n"
                  f"    except OSError:\n        pass\ntry:\n    leaked.append(os.listdir({os.path.expanduser('~')!r}))\n"
                  "except OSError:\n    pass\nif leaked:\n    def add(a, b):\n        return a + b")
        reward, info = score(fenced(attack), ADD_ROW)  # add exists only if something leaked
        assert reward == 0.0 and info["statuses"] == ["NameError"] * 4, info
    finally:
        shutil.rmtree(home)


def test_writes_outside_the_folder_do_not_land(backend):
    require(backend, "fs_write_isolated")
    name = f"pwned-{uuid.uuid4().hex}"
    targets = [f"/tmp/{name}", os.path.join(os.path.expanduser("~"), name), f"../{name}", f"/{name}"]
    attack = (f"wrote = []\nfor p in {targets!r}:\n    try:\n        open(p, 'w').write('x')\n        wrote.append(p)\n"
              "    except OSError:\n        pass\nif wrote:\n    def add(a, b):\n        return a + b")
    try:
        reward, info = score(fenced(attack), ADD_ROW)
        assert reward == 0.0 and info["statuses"] == ["NameError"] * 4, info
    finally:
        landed = sorted({p for p in [*targets[:2], f"{tempfile.gettempdir()}/{name}", f"/{name}"] if os.path.exists(p)})
        for p in landed:
            os.remove(p)
    assert not landed


def test_killing_the_parent_fails(backend):
    require(backend, "parent_protected")
    me = os.getpid()
    attacks = ["import os\nos.kill(os.getppid(), 9)", "import os\nos.killpg(os.getpgid(os.getppid()), 9)",
               f"import os\nos.kill({me}, 9)", "import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)"]
    if backend == "bwrap":  # kill(-1) = every process we may signal; the fallback's nobody could hit others
        attacks.append("import os\nos.kill(-1, 9)")
    for attack in attacks:
        reward, _ = score(fenced(attack), ADD_ROW)
        assert reward == 0.0
    assert os.getpid() == me and run_python("print('still here')").stdout == "still here\n"


def test_hostile_completions_through_the_verifier_runner():
    """The real path: the runner's worker process runs score(), which runs the sandbox."""
    class Batch:  # the runner reads only these two fields of a Rollouts
        def __init__(self, completions, rows):
            self.completions, self.rows = completions, rows

    hostile = [fenced("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
               fenced("while True:\n    print('x' * 10**6)"), fenced("x = bytearray(10 * 1024**3)")]
    if guarantees()["parent_protected"]:
        hostile.append(fenced("import os\nos.kill(os.getppid(), 9)\nos.killpg(os.getpgid(os.getppid()), 9)"))
    good = fenced("def add(a, b):\n    return a + b")
    row = {"tests": ADD_TESTS, "limits": {"wall_s": 2.0, "memory_mb": 128}}
    runner = VerifierRunner("rlpost.envs.code:score", timeout_s=15)
    try:
        rewards, infos, metrics = runner.score(Batch([*hostile, good], [row] * (len(hostile) + 1)))
        assert rewards.tolist() == [0.0] * len(hostile) + [1.0]
        assert metrics["verifier/errors"] == 0 and metrics["verifier/timeouts"] == 0
        worker = runner.proc.pid
        rewards, _, _ = runner.score(Batch([good], [row]))  # still working, same worker
        assert rewards.tolist() == [1.0] and runner.proc.pid == worker
    finally:
        runner.close()
