"""Verifiers for tests, imported by path in the verifier worker process."""

import os
import time


def raises(completion, row):
    raise RuntimeError("broken verifier")


def hangs(completion, row):
    if completion == "hang":
        time.sleep(60)
    return 1.0, {"correct": True}


def prints(completion, row):
    print("noise on stdout must not corrupt the result stream")
    return 0.5, {}


def kills_itself(completion, row):
    if completion == "die":
        os._exit(3)
    return 1.0, {}


def returns_float(completion, row):
    return 0.25


def first_char_digit(completion, row):
    """Toy task for the tiny model: reward 1 if the completion starts with the row's digit."""
    correct = completion[:1] == row["answer"]
    return float(correct), {"correct": correct}


def odd_length(completion, row):
    """Rewards that vary within a group whatever the model: 1 for an odd-length completion."""
    return float(len(completion) % 2), {}


def trl_style(prompts, completions, answer, **kwargs):
    """A TRL reward function: lists in, a list out; None = does not apply to this row."""
    out = []
    for prompt, completion, gold in zip(prompts, completions, answer):
        text = completion[0]["content"] if isinstance(completion, list) else completion
        if text == "skip":
            out.append(None)
        else:
            # 1.0 for the right answer; +0.5 when the prompt came as chat messages
            out.append(float(text.strip() == gold) + 0.5 * isinstance(prompt, list))
    return out


def half(completion, row):
    return 0.5, {"half": True}


def echo_fd1(completion, row):
    """Writes to fd 1 and fd 2 behind Python's back: must land in the log, not in a reply."""
    os.system("echo noise-on-fd-1; echo noise-on-fd-2 >&2")
    return 1.0, {}


def returns_nan(completion, row):
    return {"nan": float("nan"), "inf": float("inf"), "text": "1.0", "none": None}.get(completion, 1.0)


def spins(completion, row):
    if "marker" in row:  # tell the test the call has started
        open(row["marker"], "w").close()
    while True:
        pass


def allocates(completion, row):
    """A runaway allocation: stopped by the worker's address-space limit, a MemoryError."""
    if completion == "big":
        return float(len(bytearray(64 << 30)))
    return 1.0, {}


def group_aware(prompts, completions, completion_ids, trainer_state, answer, **kwargs):
    """TRL style, group-relative: 1 for the shortest completion of each prompt's group, and the
    arguments it was given reported back through the reward (checked by the tests)."""
    assert len(prompts) == len(completions) == len(completion_ids) == len(answer)
    lengths = [len(c) for c in completions]
    groups: dict = {}
    for i, p in enumerate(prompts):
        groups.setdefault(str(p), []).append(i)
    out = [0.0] * len(completions)
    for members in groups.values():
        out[min(members, key=lambda i: lengths[i])] = 1.0
    return [r + 10 * trainer_state.global_step + 100 * len(members) for r, members in
            zip(out, [groups[str(p)] for p in prompts])]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's signature; a dict return carries 'score' and extra fields."""
    if data_source == "dict":
        return {"score": float(solution_str == ground_truth), "acc": solution_str == ground_truth}
    return float(solution_str == ground_truth)


def fails_on_multiples_of_three(completion, row):
    """Fails on some completions only: counted, scored 0, and the run goes on."""
    if len(completion) % 3 == 0:
        raise ValueError(f"cannot score a completion of length {len(completion)}")
    return 1.0, {}


def wants_solution(prompts, completions, solution, **kwargs):
    """TRL-style, reading a `solution` column (TRL's math datasets have one)."""
    return [float(c == s) for c, s in zip(completions, solution)]


def reads_solution(completion, row):
    return float(completion == row["solution"])


def compute_score_extras(data_source, solution_str, ground_truth, extra_info=None):
    """verl's compute_score returning extras beside the score, as verl's reward_extra_info."""
    right = solution_str.strip().startswith(str(ground_truth))
    return {"score": float(right), "acc": right, "length": len(solution_str), "pred": solution_str[:3]}


def fails_once_marked(completion, row):
    """odd_length until the file named by $RLPOST_TEST_FAIL_MARKER exists, then every call raises."""
    if os.path.exists(os.environ.get("RLPOST_TEST_FAIL_MARKER", "/nonexistent")):
        raise RuntimeError("the reward service went down")
    return float(len(completion) % 2), {}


def prints_lines(completion, row):
    """Prints three lines per call (a reward function being debugged) and fails on 'x'."""
    print(f"scoring {completion!r}\nanswer {row['answer']}\n")
    if completion == "x":
        raise ValueError("cannot score x")
    return 1.0


def starts_a_daemon(completion, row):
    """Leaves a double-forked setsid() daemon behind (its pid in $RLPOST_TEST_DAEMON_PIDS), as a
    reward function that starts a helper server would."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(os.environ["RLPOST_TEST_DAEMON_PIDS"], "a") as f:
                f.write(f"{os.getpid()}\n")
            time.sleep(600)
        os._exit(0)
    os.wait()
    return float(len(completion) % 2)


def returns_text(completion, row):
    return "yes"


def always_nan(completion, row):
    return float("nan")


def past_float32(completion, row):
    """Finite as a Python float, inf in float32 (the loop's rewards): 1e39, but 3.4e38 (in range) for 'in range'."""
    return 3.4e38 if completion == "in range" else 1e39


def correct_as_text(completion, row):
    """info['correct'] as a string: 'no' would be True to bool(); numpy's bool is a boolean like Python's."""
    import numpy

    if completion == "numpy":
        return 0.0, {"correct": numpy.bool_(False)}
    return 0.0, {"correct": "no" if completion == "no" else False}


def says_pass(completion, row):
    """Correct exactly when the row's answer is 'pass', whatever the model wrote: a prompt every sample solves, or
    none (rlpost curate's band, by hand)."""
    return float(row["answer"] == "pass"), {}


def near_float32_max(completion, row):
    """Finite in float32, but its square (a std's) is not: 3.4e38 for an odd-length completion, else 0."""
    return 3.4e38 if len(completion) % 2 else 0.0
