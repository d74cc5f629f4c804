"""The prompt stream's online curriculum (envs/data.py: PromptStream), worked by hand."""

from rlpost.envs.data import PromptStream

ROWS = [{"messages": [{"role": "user", "content": f"q{i}"}]} for i in range(4)]
RATE = {"q0": 1.0, "q1": 0.0, "q2": 0.5, "q3": 0.25}  # always solved, never solved, two in the band


def visit(stream):
    batch = stream.next()
    stream.observe(batch, [RATE[r["messages"][0]["content"]] for r in batch])
    return [r["messages"][0]["content"] for r in batch]


def test_out_of_band_prompts_are_passed_over_then_re_measured():
    # window 2, band [0, 1] (0 and 1 themselves are out). Epochs 0 and 1 visit all four prompts (no
    # prompt has 2 records before its second visit); by then q0 (mean 1) and q1 (mean 0) are out, so
    # epoch 2's 2-prompt batch is q2 and q3, passing over whichever of q0, q1 its order puts before
    # them. A pass-over forgets one record: that prompt is in again at its next turn.
    s = PromptStream(ROWS, 2, seed=0, curriculum=(2, 0.0, 1.0))
    first_two_epochs = [q for _ in range(4) for q in visit(s)]
    assert sorted(first_two_epochs) == sorted(["q0", "q1", "q2", "q3"] * 2) and s.skipped == 0
    assert [s.learnable(r) for r in ROWS] == [False, False, True, True]
    order = [ROWS[i]["messages"][0]["content"] for i in s.permutation(2)]
    before = order[: max(order.index("q2"), order.index("q3"))]
    assert sorted(visit(s)) == ["q2", "q3"] and s.skipped == len({"q0", "q1"} & set(before)) > 0
    passed = [r for r in ROWS[:2] if r["messages"][0]["content"] in before]
    assert all(s.learnable(r) for r in passed)  # re-measured at its next turn


def test_a_narrow_band_and_an_all_out_stream_still_yield_batches():
    # band [0.4, 0.6] leaves only q2 (0.5) once every prompt has 1 record (window 1)
    s = PromptStream(ROWS, 1, seed=0, curriculum=(1, 0.4, 0.6))
    for _ in range(4):
        visit(s)
    assert visit(s) == ["q2"]
    # every prompt out of band: after passing over one epoch's worth (4) the stream takes the next anyway
    all_out = PromptStream(ROWS, 2, seed=0, curriculum=(1, 0.9, 1.0))
    for _ in range(2):
        visit(all_out)
    RATE_BEFORE = dict(RATE)
    RATE.update({k: 0.0 for k in RATE})
    try:
        for _ in range(2):
            visit(all_out)
        assert len(all_out.next()) == 2
    finally:
        RATE.update(RATE_BEFORE)


def test_the_curriculum_state_resumes_and_off_means_off():
    s = PromptStream(ROWS, 2, seed=0, curriculum=(2, 0.0, 1.0))
    for _ in range(4):
        visit(s)
    again = PromptStream(ROWS, 2, seed=0, curriculum=(2, 0.0, 1.0))
    again.load_state_dict(s.state_dict())
    assert visit(again) == visit(s) and again.skipped == s.skipped > 0
    off = PromptStream(ROWS, 2, seed=0, curriculum=(0, 0.0, 1.0))
    assert off.observe(ROWS, [1.0] * 4) == {} and off.learnable(ROWS[0])


def test_files_that_are_not_rows_are_one_line_naming_them(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import pytest

    from rlpost.envs.data import DataError, read_rows

    (tmp_path / "d.csv").write_text("prompt,answer\n1+1,2\n")
    with pytest.raises(DataError, match="d.csv: a CSV file; rlpost reads JSONL .* convert it"):
        read_rows(tmp_path / "d.csv")
    (tmp_path / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(DataError, match="deep.jsonl:1: JSON nested too deeply to read"):
        read_rows(tmp_path / "deep.jsonl")
    # a parquet table of no rows (what curate writes when it keeps nothing) reads as no rows, not an error
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    assert read_rows(tmp_path / "empty.parquet") == []
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="bad.parquet: not a readable parquet file"):
        read_rows(tmp_path / "bad.parquet")
    # load_dataset(...).save_to_disk() writes a DatasetDict: its splits are named, not "not saved by datasets"
    import datasets

    rows = datasets.Dataset.from_list([{"prompt": "1+1", "answer": "2"}])
    datasets.DatasetDict({"train": rows, "test": rows}).save_to_disk(str(tmp_path / "gsm"))
    with pytest.raises(DataError, match=r"gsm: a DatasetDict folder \(splits test, train\); name one split's folder, "
                                        r"e.g. .*gsm/test$"):
        read_rows(tmp_path / "gsm")
    assert read_rows(tmp_path / "gsm" / "train")[0]["answer"] == "2"
    # a byte-order mark before the first row (Windows' editors write one) is no text; the rows read as without it
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + b'{"prompt": "1+1", "answer": "2"}\n{"prompt": "x"}\n')
    assert [r["prompt"] for r in read_rows(tmp_path / "bom.jsonl")] == ["1+1", "x"]


def test_a_bad_row_of_a_table_is_named_by_its_number(tmp_path):
    import datasets
    import pytest

    from rlpost import config
    from rlpost.envs.data import DataError
    from rlpost.envs.dataset import load_rows

    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}, {"prompt": None, "answer": "3"}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "d.parquet"))
    cfg = config.load(None, ["task.name=dataset", f"task.data={tmp_path / 'd.parquet'}"])
    with pytest.raises(DataError, match=r"d.parquet row 3: 'prompt' must be"):
        load_rows(str(tmp_path / "d.parquet"), cfg.task)
