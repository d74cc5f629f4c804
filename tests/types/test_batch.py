"""types/batch.py: Rollouts, the batch every role crosses, through its public methods, worked by hand."""

import torch

from rlpost.types.batch import Rollouts

t = torch.tensor


def rollouts(prompts, completions, groups, version=0, **extra):
    """Rows from lists of prompt and completion token ids (0 = padding), left- and right-padded as the sampler does."""
    P, T = max(map(len, prompts)), max(map(len, completions))
    pids = t([[0] * (P - len(p)) + p for p in prompts])
    cids = t([c + [0] * (T - len(c)) for c in completions])
    return Rollouts(prompt_ids=pids, prompt_mask=pids != 0, completion_ids=cids, completion_mask=cids != 0,
                    sampler_logp=-(cids != 0).float(), truncated=t([False] * len(prompts)), group_ids=t(groups),
                    rows=[{"i": g} for g in groups], completions=[str(c) for c in completions],
                    policy_version=version, **extra)


def test_cat_repads_prompts_on_the_left_completions_on_the_right_and_renumbers_groups():
    a = rollouts([[5, 6], [5, 6]], [[7], [8, 9]], [3, 3], version=2, reward=t([1.0, 0.0]))
    b = rollouts([[4, 4, 4]], [[1, 2, 3]], [0], version=1, reward=t([0.5]))
    out = Rollouts.cat([a, b])
    assert out.prompt_ids.tolist() == [[0, 5, 6], [0, 5, 6], [4, 4, 4]]  # every prompt still ends at column P-1
    assert out.completion_ids.tolist() == [[7, 0, 0], [8, 9, 0], [1, 2, 3]]  # every completion starts at column P
    assert out.prompt_mask.tolist() == [[False, True, True], [False, True, True], [True, True, True]]
    assert out.group_ids.tolist() == [0, 0, 1]  # a's group 3 and b's group 0 stay two groups, in order
    assert out.reward.tolist() == [1.0, 0.0, 0.5] and out.rows == [{"i": 3}, {"i": 3}, {"i": 0}]
    assert out.policy_version == 1  # the oldest weights any row was sampled with


def test_select_takes_rows_of_every_per_row_field_and_keeps_the_rest():
    batch = rollouts([[5], [6], [7]], [[1], [2, 2], [3]], [0, 0, 1], version=4, reward=t([0.25, 0.5, 0.75]),
                     norm_tokens=9.0)
    out = batch.select(t([2, 0]))
    assert out.completion_ids.tolist() == [[3, 0], [1, 0]] and out.reward.tolist() == [0.75, 0.25]
    assert out.rows == [{"i": 1}, {"i": 0}] and out.completions == ["[3]", "[1]"]
    assert out.policy_version == 4 and out.norm_tokens == 9.0  # not per-row: kept as they were
    assert len(batch.select(slice(0, 2))) == 2


def test_cat_of_a_filtered_out_round_adds_no_rows():
    # DAPO's refill may keep nothing of a round: an empty part changes neither the rows nor the group numbering
    a = rollouts([[5]], [[1]], [7], reward=t([1.0]))
    empty = a.select(t([], dtype=torch.long))
    out = Rollouts.cat([a, empty, a])
    assert len(out) == 2 and out.group_ids.tolist() == [0, 1]


def test_token_versions_follow_their_tokens_through_cat_select_and_trim():
    # partial rollouts: a's second row took version 3 from its second token on
    a = rollouts([[5], [6]], [[1], [2, 2]], [0, 0], version=2, token_version=t([[2, 0], [2, 3]]))
    b = rollouts([[7]], [[4, 4, 4]], [0], version=3, token_version=t([[3, 3, 3]]))
    out = Rollouts.cat([a, b])
    assert out.token_version.tolist() == [[2, 0, 0], [2, 3, 0], [3, 3, 3]]  # right-padded with 0, as the tokens
    assert out.policy_version == 2
    assert out.select(t([1])).token_version.tolist() == [[2, 3, 0]]
    assert a.select(t([0])).trimmed().token_version.tolist() == [[2]]  # cut with the completion columns
