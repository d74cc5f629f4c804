"""Rollout role on transformers `generate`: K samples per prompt, and the sampler's own log-probs.

The sampler holds its own copy of the policy, in ``dtype`` (bf16 where the precision probe finds
it faster, ~2x faster generation than fp32 on AVX-512 BF16 cores; float32 elsewhere:
model/precision.py), and receives the trainer's float32 weights through
``load_weights`` after each update.

Sampling is set up so that we know exactly which distribution drew each token: `generate` gets
temperature 1, top-k off, top-p off, and our own processor does the rest. ``_RecordLogp`` divides
the raw logits by the temperature, applies top-p (if any) and remembers the log softmax of what it
hands on, which is the distribution drawn from and the one the trainer optimises. The recorded
log-prob of token t is read one call later, once `generate` has appended token t to ``input_ids``.

Top-p: the sampler samples from the truncated distribution, so it records that (renormalised
over the kept tokens) and the truncation threshold, ``Rollouts.sampler_floor``; the trainer and
the reference then truncate their own log-probs at the same threshold (model/logprobs.py), so all
three score the same distribution ("keep sampling mask", DeepSeek-V3.2, arXiv:2512.02556).
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    TopPLogitsWarper,
)

from rlpost.envs.dataset import RAW_PROMPT
from rlpost.model import device, precision
from rlpost.types.batch import Rollouts


def top_p_truncate(logp: Tensor, top_p: float) -> tuple[Tensor, Tensor]:
    """(log-probs renormalised over the top-p set, -inf elsewhere (b, V); the threshold (b,)). The
    set is transformers' TopPLogitsWarper's, the one `generate` would keep (softmax(logp) =
    softmax(logits)). The threshold lies halfway, in full-softmax log-prob, between the least likely
    kept token and the most likely dropped one (-inf when none is dropped): the kept token at the
    edge sits exactly on its own log-prob, so a threshold there would lose it to the trainer's
    rounding about half the time."""
    kept = TopPLogitsWarper(top_p)(None, logp)  # (b, V), -inf outside the set
    is_kept = kept.isfinite()
    last_kept = logp.masked_fill(~is_kept, float("inf")).min(-1).values  # (b,)
    first_dropped = logp.masked_fill(is_kept, float("-inf")).max(-1).values  # (b,)
    return kept - kept.logsumexp(-1, keepdim=True), (last_kept + first_dropped) / 2


class _RecordLogp(LogitsProcessor):
    """Temperature-scales scores, truncates them to top-p, and records log pi(token) of each
    sampled token under that distribution, with the truncation threshold."""

    def __init__(self, temperature: float, top_p: float = 1.0):
        self.temperature, self.top_p = temperature, top_p
        self.prev: Tensor | None = None  # (B, V) log-probs of the step before
        self.prev_floor: Tensor | None = None  # (B,) its top-p threshold
        self.logp: list[Tensor] = []  # T entries of (B,)
        self.floor: list[Tensor] = []  # T entries of (B,) when top_p < 1

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if self.prev is not None:
            self.collect(input_ids[:, -1])
        self.prev = (scores / self.temperature).float().log_softmax(-1)  # (B, V)
        if self.top_p < 1.0:
            self.prev, self.prev_floor = top_p_truncate(self.prev, self.top_p)
        return self.prev  # generate's softmax of these is the distribution recorded

    def collect(self, tokens: Tensor) -> None:
        self.logp.append(self.prev.gather(-1, tokens[:, None]).squeeze(-1))  # (B,)
        if self.prev_floor is not None:
            self.floor.append(self.prev_floor)
        self.prev = self.prev_floor = None


class _StopOnText(StoppingCriteria):
    """Per-row stop once the row's generated text contains a stop string. transformers' own
    ``stop_strings`` needs the string's characters as token pieces of the vocabulary, which a small
    tokenizer may not have; decoding works for any tokenizer. 'Contains', not 'ends with': a token
    may carry the stop string's last characters and more ('>' + newline as one token)."""

    def __init__(self, tok, stops: list[str], prompt_len: int):
        self.tok, self.stops, self.P = tok, stops, prompt_len

    def __call__(self, input_ids: Tensor, scores: Tensor, **kwargs) -> Tensor:
        texts = self.tok.batch_decode(input_ids[:, self.P :])
        return torch.tensor([any(s in t for s in self.stops) for t in texts], device=input_ids.device)


class HFRollout:
    def __init__(self, model: torch.nn.Module, tokenizer, dtype: torch.dtype | None = None):
        dtype = dtype or precision.sampler_dtype("auto")  # None: what the probe chose
        # No requires_grad_(False) here, on purpose: measured on these CPUs, bf16 `generate` runs
        # 2.5x slower when the parameters have requires_grad=False (23.8 s vs 9.3 s for 128 x 20
        # tokens). generate already runs under no_grad, so nothing is lost.
        self.model = model.to(dtype).eval()
        self._init_sampler(model, tokenizer, dtype)

    def _init_sampler(self, model: torch.nn.Module, tokenizer, dtype: torch.dtype) -> None:
        """What every verb inherited from this class reads, whichever engine draws the tokens
        (roles/rollout_vllm.py calls it without keeping a model)."""
        self.tok = tokenizer
        self.dtype = dtype
        self.eos_ids = _eos_ids(model, tokenizer)
        self.eos_set = set(self.eos_ids.tolist())
        self.version = 0  # trainer step of the weights held (set by load_weights); stamped on every batch
        self.last_metrics: dict = {}  # nothing beyond the batch to report
        self.discarded = None  # [(storage, bytes)] while sleep(discard_weights=True) has freed the weights

    def render(self, rows: list[dict]) -> list[str]:
        """Each row's prompt text: its messages through the chat template, ending with the assistant
        turn, or (task.prompt_format=raw, TRL's standard format) its string prompt as it is."""
        return [r[RAW_PROMPT] if RAW_PROMPT in r else
                self.tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False) for r in rows]

    @torch.no_grad()
    def generate(self, rows: list[dict], n: int, temperature: float, top_p: float, max_new_tokens: int) -> Rollouts:
        """n completions of each row; temperature 0 = greedy (no log-probs recorded)."""
        enc = self.encode(rows)
        completion, sampler_logp, floor = self._sample((enc.input_ids, enc.attention_mask), n, temperature, top_p,
                                                       max_new_tokens)
        return self.assemble(enc, rows, n, completion, sampler_logp, floor)

    def encode(self, rows: list[dict]):
        """The chat-templated prompts, tokenised and left-padded."""
        return self.tok(self.render(rows), return_tensors="pt", padding=True, add_special_tokens=False)

    def assemble(self, enc, rows: list[dict], n: int, completion: Tensor, sampler_logp: Tensor,
                 sampler_floor: Tensor | None = None) -> Rollouts:
        """The batch from the prompts and their sampled completions (B = len(rows) * n)."""
        mask = self.completion_mask(completion)  # (B, T)
        return Rollouts(
            prompt_ids=enc.input_ids.repeat_interleave(n, dim=0),
            prompt_mask=enc.attention_mask.bool().repeat_interleave(n, dim=0),
            completion_ids=completion,
            completion_mask=mask,
            sampler_logp=sampler_logp * mask,
            truncated=~torch.isin(completion, self.eos_ids).any(dim=1),
            group_ids=torch.arange(len(rows)).repeat_interleave(n),
            rows=[r for r in rows for _ in range(n)],
            completions=self.tok.batch_decode(completion * mask + self.tok.pad_token_id * ~mask,
                                              skip_special_tokens=True),
            policy_version=self.version,
            sampler_floor=sampler_floor.where(mask, 0.0) if sampler_floor is not None else None,  # -inf * 0 is nan
        )

    def _sample(self, prompt: tuple[Tensor, Tensor], n: int, temperature: float, top_p: float, max_new_tokens: int,
                stop_strings: list[str] | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """(completion (B*n, T) int64, sampler log-probs (B*n, T) float32, zeros when greedy;
        top-p thresholds (B*n, T) float32, None without truncation)."""
        input_ids, attention_mask = prompt  # (B, P) each: the left-padded prompts, their mask
        self._check_awake()
        # Sample on the model's device; the batch is assembled where the prompts came from (the host).
        home, dev = input_ids.device, device.of(self.model)
        input_ids, attention_mask = input_ids.to(dev), attention_mask.to(dev)
        P = input_ids.shape[1]
        greedy = temperature == 0
        recorder = None if greedy else _RecordLogp(temperature, top_p)
        procs = LogitsProcessorList([] if greedy else [recorder])
        # A fresh GenerationConfig, not the model's: a model may ship top_k / top_p / repetition
        # penalties in its generation_config.json, which would silently change the distribution.
        gen_cfg = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=not greedy, num_return_sequences=n,
            pad_token_id=self.tok.pad_token_id, eos_token_id=self.eos_ids.tolist(),
            # top_k=0 spelled out: `generate` fills unset fields from the model's generation_config
            # and then from its own defaults, where top_k is 50. Until this was set, HFRollout drew
            # from the top 50 tokens while recording (and training) the full softmax: on the tiny
            # model 50 distinct first tokens were drawn where the policy gives all 76 mass.
            **({} if greedy else {"top_k": 0}),
        )
        stopping = StoppingCriteriaList([_StopOnText(self.tok, stop_strings, P)] if stop_strings else [])
        out = self.model.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=gen_cfg, logits_processor=procs,
            stopping_criteria=stopping,
        )  # (B, P+T)
        completion = out[:, P:]  # (B, T)
        B, T = completion.shape
        if recorder is not None and recorder.prev is not None:
            recorder.collect(completion[:, len(recorder.logp)])  # the last sampled token
        # (B, T)
        sampler_logp = (torch.stack(recorder.logp, dim=1) if recorder
                        else completion.new_zeros(B, T, dtype=torch.float32))
        floor = torch.stack(recorder.floor, dim=1).float().to(home) if recorder and recorder.floor else None  # (B, T)
        return completion.to(home), sampler_logp.float().to(home), floor

    @torch.no_grad()
    def sample_ids(self, seqs: list[list[int]], temperature: float, top_p: float, max_new_tokens: int,
                   stop_strings: list[str]) -> list[tuple[list[int], list[float], str]]:
        """Continue each token sequence once: (new token ids, their sampler log-probs, how it ended)
        (``continue_ids``)."""
        return continue_ids(self, seqs, temperature, top_p, max_new_tokens, stop_strings)

    def completion_mask(self, completion: Tensor) -> Tensor:  # (B, T) bool
        """True up to and including the first EOS; all True if there is none (truncated)."""
        is_eos = torch.isin(completion, self.eos_ids)  # (B, T)
        after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0  # strictly after the first EOS
        return ~after_eos

    @torch.no_grad()
    def load_weights(self, state: dict[str, Tensor], version: int | None = None) -> None:
        """Weight sync: copy the trainer's (float32) weights into the sampler's copy, casting;
        `version` is the trainer step they come from."""
        if self.discarded:
            self._restore(state)
        own = self.model.state_dict()
        for name, value in state.items():
            own[name].copy_(value)
        if version is not None:
            self.version = version

    def sleep(self, discard_weights: bool = False) -> None:
        """Free what only sampling needs before the trainer's update, the run's memory peak; the
        next ``generate`` rebuilds it (``generate`` itself keeps nothing between calls).

        discard_weights: also free the sampler's weights (0.27 GB for the 135M model in bf16),
        as vLLM's sleep level 2 does for a colocated trainer. Only for a caller that syncs
        weights before the next ``generate``: until ``load_weights`` they are gone."""
        if discard_weights and not self.discarded:
            storages = {p.untyped_storage().data_ptr(): p.untyped_storage() for p in self.model.parameters()}
            self.discarded = [(st, st.nbytes()) for st in storages.values()]
            for st, _ in self.discarded:
                st.resize_(0)  # every view into it (fused projections, tied head) stays valid

    def close(self) -> None:
        """Nothing to release: the weights go with the object."""

    def _restore(self, state: dict[str, Tensor]) -> None:
        missing = [n for n, _ in self.model.named_parameters(remove_duplicate=False) if n not in state]
        if missing:
            raise ValueError(f"the sampler's weights were discarded and this sync lacks {missing[:3]}")
        for st, nbytes in self.discarded:
            st.resize_(nbytes)  # fresh memory; the copy below fills every parameter
        self.discarded = None

    def _check_awake(self) -> None:
        if self.discarded:
            raise RuntimeError("generate after sleep(discard_weights=True) without load_weights: "
                               "the sampler holds no weights")



def continue_ids(rollout, seqs: list[list[int]], temperature: float, top_p: float, max_new_tokens: int,
                 stop_strings: list[str]) -> list[tuple[list[int], list[float], str]]:
    """Continue each token sequence once with ``rollout._sample``: (new token ids, their sampler
    log-probs, how it ended).

    A continuation ends at the first EOS ('eos', kept), at the token that completes one of
    ``stop_strings`` ('stop', kept, nothing after it; that token may carry a few characters past
    the stop string), or at ``max_new_tokens`` ('length').
    Multi-turn episodes (roles/rollout_env.py) call this once per turn on token ids they already
    hold, so no earlier token is ever re-tokenised."""
    tok = rollout.tok
    width = max(map(len, seqs))
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])  # left-padded
    attn = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    completion, logp, _ = rollout._sample((ids, attn), 1, temperature, top_p, max_new_tokens, stop_strings)
    out = []
    for toks, lps in zip(completion.tolist(), logp.tolist()):
        end, how = len(toks), "length"
        for k, t in enumerate(toks):
            if t in rollout.eos_set:
                end, how = k + 1, "eos"
                break
            text = tok.decode(toks[: k + 1])
            if any(s in text for s in stop_strings):
                end, how = k + 1, "stop"
                break
        out.append((toks[:end], lps[:end], how))
    return out

def _eos_ids(model, tokenizer) -> Tensor:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids]) | {tokenizer.eos_token_id}
    return torch.tensor(sorted(i for i in ids if i is not None))
