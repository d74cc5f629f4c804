"""docs/environments.md's agent, exactly, trained end to end on the tiny model: `rlpost train
task.name=agent task.agent=FILE:play task.env=guess`, its episodes run against the run's endpoint."""

import json
import re
from pathlib import Path

import pytest
from helpers import TINY, cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_docs_agent_trains_end_to_end(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "environments.md").read_text(), re.S)
    (agent,) = [b for b in blocks if "def play(client: OpenAI, row: dict)" in b]
    assert len(agent.strip().splitlines()) <= 20  # the docs promise a 20-line agent
    (tmp_path / "my_agent.py").write_text(agent)
    monkeypatch.chdir(tmp_path)
    result = cli("train", *TINY, "task.name=agent", "task.agent=my_agent.py:play", "task.env=guess",
                 "task.max_turns=4", "task.env_workers=4", "rollout.max_new_tokens=4", f"run.out_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = [p for p in tmp_path.iterdir() if p.name.startswith("agent-grpo-")]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["env/episodes"] for r in rows] == [16, 16]
    # every episode ran the agent's loop to its end: 1 to 4 calls, none failed, the reward the agent gave
    assert all(1 <= r["env/turns_mean"] <= 4 and r["env/errors"] == 0 and r["env/timeouts"] == 0 for r in rows)
    samples = [json.loads(x) for x in (run / "samples" / "step_000001.jsonl").read_text().splitlines()]
    assert samples and all(s["prompt"].startswith("I think of a number from 1 to 5.") for s in samples)
    assert all(1 <= s["info"]["turns"] <= 4 and s["info"]["stop"] == "done" for s in samples)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["heldout_n"] == 8
