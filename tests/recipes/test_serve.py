"""`rlpost serve` (recipes/serve.py, recipes/serving.py): one line with the URL, the OpenAI API on it,
Ctrl-C stops it cleanly (exit 0); a bad argument is one line before the model loads."""

import os
import signal
import subprocess
import sys
import time

import openai
import pytest
from helpers import ROOT, cli

from rlpost.recipes import serve


@pytest.mark.slow
def test_serve_prints_its_url_answers_the_openai_client_and_stops_on_ctrl_c():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), *sys.path])}
    proc = subprocess.Popen([sys.executable, "-m", "rlpost.cli", "serve", "tiny", "--port", "0", "--max-tokens", "5"],
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        line = proc.stderr.readline()  # the first line says where
        assert line.startswith("rlpost: serving tiny at http://127.0.0.1:") and "Ctrl-C stops" in line, line
        url = line.split(" at ")[1].split()[0]
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=50, temperature=0.0)
        assert reply.usage.prompt_tokens == 4 and 1 <= reply.usage.completion_tokens <= 5  # --max-tokens caps it
        again = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=50, temperature=0.0)
        assert again.choices[0].message.content == reply.choices[0].message.content  # greedy is greedy
        assert client.models.list().data[0].id == "tiny"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and err.strip().splitlines() == [
        "rlpost: a request asked for max_tokens=50; this endpoint draws at most 5 tokens a request (rlpost serve "
        "--max-tokens), and such answers end with finish_reason 'length'", "rlpost: stopped"], err
    time.sleep(0.2)
    with pytest.raises(openai.APIConnectionError):  # nothing is left listening
        client.models.list()


def test_a_bad_port_or_budget_is_one_line_before_the_model_loads():
    result = cli("serve", "tiny", "--port", "70000")
    assert result.returncode == 2 and result.stderr.strip() == (
        "rlpost: error: --port 70000: expected 0..65535 (0: a free one)")
    assert "expected a whole number >= 1" in cli("serve", "tiny", "--max-tokens", "0").stderr


def test_a_run_folder_serves_its_model(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert serve.target(str(tmp_path)) == str(tmp_path / "model")
    assert serve.target(str(tmp_path / "model")) == str(tmp_path / "model")
    assert serve.target("embedded") == "embedded"
