#!/bin/bash
# Device check for issue 20 (precision chosen by the probe on a GPU) and the GPU path of the loop.
# Run from the repository root on a machine with a CUDA GPU and a CUDA build of torch:
#   bash scripts/gpu_check.sh
# (no install needed beyond torch, transformers, accelerate, psutil, pyyaml, tqdm, matplotlib,
# cloudpickle, safetensors and pytest; CI never runs it).
export PYTHONPATH=$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/rlpost-gpu-check}
nvidia-smi -L
python3 -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
python3 -m pip list 2>/dev/null | grep -iE "^(psutil|pyyaml|tqdm|matplotlib|cloudpickle|safetensors|hypothesis|pytest) " | tr -s ' '
echo "== 1. the probe on the GPU"
python3 -c "
from rlpost.model import precision
c = precision.choose('cuda'); print('CHOICE bf16=%s: %s' % (c.bf16, c.reason))
print('sampler dtype', precision.sampler_dtype('auto', 'cuda'), 'trainer bf16', precision.trainer_bf16('auto', 'cuda'))"
echo "== 2. tiny model, 3 steps on cuda, defaults (auto precision, auto engine, auto trainer.forward)"
time python3 -m rlpost.cli train model.name=tiny run.device=cuda rollout.max_new_tokens=8 rollout.prompts_per_step=8 rollout.group_size=4 task.n_train=64 task.n_heldout=16 run.steps=3 run.progress=false run.out_dir=$OUT/runs run.name=tiny 2>&1 | grep -vE "Warning|warn" | tail -25
python3 -c "
import json; rows=[json.loads(l) for l in open('$OUT/runs/tiny/metrics.jsonl')]
for m in rows:
    if 'timing_s/update' in m: print({k: m.get(k) for k in ('step','reward/mean','timing_s/gen','timing_s/update','perf/max_memory_allocated_gb','perf/threads','actor/logp_diff_sampler_mean')})
s=json.load(open('$OUT/runs/tiny/summary.json')); print('SUMMARY', {k: s.get(k) for k in ('heldout_accuracy_before','heldout_accuracy_after','peak_rss_gb','perf/max_memory_allocated_gb')})"
rm -rf $OUT/runs/tiny/checkpoints $OUT/runs/tiny/model
echo "== 3. trainer.forward=packed on cuda is refused in one line"
python3 -m rlpost.cli train model.name=tiny run.device=cuda trainer.forward=packed run.steps=1 run.progress=false run.out_dir=$OUT/runs run.name=packed 2>&1 | grep -vE "Warning|warn" | tail -3; echo "exit ${PIPESTATUS[0]}"
echo "== 4. tests that touch a real GPU or the device plumbing"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/roles/test_param_dtype.py tests/model/test_device.py tests/model/test_precision.py tests/model/test_packed.py tests/model/test_cores.py 2>&1 | tail -15
