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
