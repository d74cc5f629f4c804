"""keep_freed (model/heap.py): a freed block's pages stay in the process, so allocating it again
faults no page in; without it glibc unmaps a 96 MB block on free and a 64 MB one after it faults ~16K pages."""

import subprocess
import sys

import pytest

from rlpost.model import heap

CODE = """
import resource, sys, torch
from rlpost.model import heap
if sys.argv[1] == "keep":
    assert heap.keep_freed()
torch.ones(24 * 2**20).sum()  # 96 MB, touched, then freed
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.ones(16 * 2**20).sum()  # 64 MB: fits in the freed block (an equal size may not: torch asks for aligned blocks)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(heap.find_libc() is None or not hasattr(heap.find_libc(), "mallopt"), reason="not glibc")
def test_kept_memory_is_reused_without_page_faults():
    faults = {arm: int(subprocess.run([sys.executable, "-c", CODE, arm], capture_output=True, text=True, check=True)
                       .stdout)
              for arm in ("keep", "plain")}
    assert faults["plain"] > 10_000 and faults["keep"] < 1_000, faults  # 64 MB = 16,384 pages of 4 KB
