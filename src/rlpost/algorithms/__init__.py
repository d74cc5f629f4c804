"""Algorithms: one file each, readable top to bottom, each naming the patch it applies to its
predecessor (docs/algorithms.md has the table). Every algorithm class has

  name, traits         its config name and what it needs from the loop (types/roles.py: Traits)
  reads                the algo keys it reads (config_check.py and build.check refuse the others' keys)
  from_config(algo, group_size, max_new_tokens)   itself, its knobs read from the algo section
  advantages(batch)    -> Advantages: (B, T) token advantages and metrics
  loss(logp, batch)    -> (loss, metrics), normalised by mini-batch totals

``ALGORITHMS`` is the registry; ``build(...)`` returns the ``Objective`` the loop calls (the
algorithm with the shared knobs around it, objective.py). What an algorithm cannot run is refused
by ``build.check`` from its traits, so nothing outside this package names an algorithm.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import traceback
from dataclasses import replace

from rlpost.algorithms import core, turns
from rlpost.algorithms.cispo import CISPO
from rlpost.algorithms.dapo import DAPO
from rlpost.algorithms.distill import Distill
from rlpost.algorithms.dr_grpo import DrGRPO
from rlpost.algorithms.grpo import GRPO
from rlpost.algorithms.gspo import GSPO
from rlpost.algorithms.objective import Objective, old_logp_first
from rlpost.algorithms.offpolicy import with_icepop, with_offpolicy_mask
from rlpost.algorithms.ppo import PPO
from rlpost.algorithms.reinforce import Reinforce
from rlpost.algorithms.reinforce_pp import ReinforcePP
from rlpost.algorithms.rloo import RLOO
from rlpost.algorithms.wrappers import (
    with_clip_cov,
    with_entropy_advantage,
    with_entropy_bonus,
    with_kl_cov,
    with_named_inputs,
    with_tis,
)
from rlpost.sections import AlgoConfig
from rlpost.types.errors import ConfigError, Interrupted, RunError
from rlpost.types.roles import Traits
from rlpost.wire import import_object

# In the order of docs/algorithms.md: the root, then each patch.
ALGORITHMS = {cls.name: cls for cls in (Reinforce, PPO, ReinforcePP, GRPO, RLOO, DAPO, DrGRPO, GSPO, CISPO, Distill)}

__all__ = ["ALGORITHMS", "Objective", "build", "resolve", "traits", "needs_old_logp_first", "loss_takes_entropy",
           "STALE_TIS_CAP", "turns"]  # turns: build.check asks it which credit rules an algorithm takes
# what an algorithm of your own must have (docs/algorithms.md)
CONTRACT = ("traits", "from_config", "advantages", "loss")

# Truncation of the importance weight pi_trainer / pi_sampler when samples may be stale (the async
# topology) and algo.tis_cap is unset: they come from older weights, so they need the correction.
# V-trace's rho-bar (Espeholt et al. 2018) is 1; 2 keeps more of the signal of the tokens the stale
# sampler under-weighted and still bounds the variance.
STALE_TIS_CAP = 2.0


def resolve(name: str) -> type:
    """The algorithm class algo.name names: a registry name, or your own by import path,
    'package.module:Class' or '/path/to/file.py:Class' (kept in config.yaml, so eval and --resume
    find it again), checked against the contract (CONTRACT, with Traits as its traits)."""
    if name in ALGORITHMS:
        return ALGORITHMS[name]
    if ":" not in name:
        raise ConfigError(f"algo.name: expected one of {', '.join(ALGORITHMS)}, or your own as 'module:Class', got "
                          f"{name!r}")
    cls = _import_own(name)
    missing = [m for m in CONTRACT if not hasattr(cls, m)]
    if not isinstance(cls, type) or missing or not isinstance(cls.traits, Traits):
        raise ConfigError(f"algo.name: {name} is not an algorithm: expected a class with {', '.join(CONTRACT)} "
                          f"(traits a rlpost.types.roles.Traits){'; missing ' + ', '.join(missing) if missing else ''} "
                          "(docs/algorithms.md, your own algorithm)")
    return cls


def _import_own(name: str) -> type:
    """The user's algorithm class: whatever its module raises on import, SystemExit and a
    KeyboardInterrupt of its own included, is one ConfigError naming the module and its line. A
    Ctrl-C that arrives meanwhile is still a Ctrl-C: rlpost's stop handlers raise Interrupted, and
    Python's own SIGINT handler is watched here, so a KeyboardInterrupt no signal caused is told apart."""
    interrupted: list[int] = []
    with _noting_sigint(interrupted):
        try:
            return import_object(name, "Class")
        except Interrupted:
            raise
        except KeyboardInterrupt as e:
            if interrupted:
                raise
            why = (f"importing {name} raised KeyboardInterrupt{own_frame(e)}, though no Ctrl-C came; an algorithm's "
                   "module runs in the trainer and must not stop it")
        except SystemExit as e:
            why = (f"importing {name} called sys.exit({e.code!r}){own_frame(e)}; an algorithm's module runs in the "
                   "trainer and must not end it")
        except Exception as e:  # the user's module: any error it raises on import is theirs to see
            why = f"cannot import {name} ({type(e).__name__}: {e}){own_frame(e)}"
    # raised out here, with no exception as its context: the CLI reports a KeyboardInterrupt found in
    # an error's context as the stop it was (types/errors.py: interrupt_in)
    raise ConfigError(f"algo.name: {why}")


@contextlib.contextmanager
def _noting_sigint(received: list[int]):
    """Records in ``received`` a SIGINT handled while the block runs, by Python's handler (or any
    callable one, which still runs); from the main thread only, where Python delivers signals."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return

    def note(signum, frame):
        received.append(signum)
        previous(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


RLPOST_DIR = os.path.dirname(os.path.abspath(__file__)).rpartition(os.sep)[0]


def own_frame(e: BaseException) -> str:
    """' (at FILE:LINE, in FUNCTION)' for the user's line in ``e``'s traceback: the deepest frame in the
    file of the first frame outside rlpost and the import machinery (the user's module or method);
    '' when every frame is rlpost's."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith("<frozen") and not f.filename.startswith(RLPOST_DIR + os.sep)]
    if not frames:
        return ""
    last = [f for f in frames if f.filename == frames[0].filename][-1]
    return f" (at {last.filename}:{last.lineno}, in {last.name})"


class OwnCode:
    """A method of the user's algorithm (from_config, advantages, loss): an exception raised in the
    user's code is one RunError naming the algorithm, the exception and the user's line, instead of a
    traceback through the loop. What rlpost raises already as one line, running out of memory and an
    error outside the user's lines (a method inherited unchanged) go on as they are."""

    def __init__(self, fn, name: str):
        self.fn, self.name = fn, name

    def __call__(self, *args, **kwargs):
        try:
            return self.fn(*args, **kwargs)
        except (ConfigError, RunError, MemoryError):
            raise
        except Exception as e:
            where = own_frame(e)
            if not where or "out of memory" in str(e) or "can't allocate memory" in str(e):
                raise
            raise RunError(f"algo.name: your algorithm {self.name} raised {type(e).__name__}: {e}{where}") from None


def traits(name: str) -> Traits:
    """The traits of the algorithm ``name`` (an algo.name that ``build.check`` has accepted)."""
    return resolve(name).traits


def build(algo: AlgoConfig, group_size: int, max_new_tokens: int, stale_samples: bool = False,
          turn_credit: str = "episode", turn_discount: float = 1.0) -> Objective:
    """The algorithm algo.name with its knobs from the algo section and the rollout's group size and
    length cap, with the shared knobs on. stale_samples: the sampler may run ahead of the trainer
    (dist.topology=async), so TIS is on at STALE_TIS_CAP unless algo.tis_cap or algo.icepop_c says otherwise.
    turn_credit, turn_discount: task.turn_credit and task.turn_discount, for environment episodes."""
    # KL-Cov's surrogate is unclipped: its penalty is the trust region (wrappers.with_kl_cov)
    if algo.cov_control == "kl_cov":
        algo = replace(algo, clip_eps_low=math.inf, clip_eps_high=math.inf, dapo_clip_eps_high=math.inf)
    cls = resolve(algo.name)
    own = algo.name not in ALGORITHMS  # the user's: their exceptions are one line (OwnCode)
    policy = (OwnCode(cls.from_config, algo.name) if own else cls.from_config)(algo, group_size, max_new_tokens)
    # yours may name fewer inputs than rlpost's losses (with_named_inputs)
    loss = with_named_inputs(OwnCode(policy.loss, algo.name), cls.traits.needs_values) if own else policy.loss
    if own:
        policy.advantages = OwnCode(policy.advantages, algo.name)
    if algo.cov_control == "clip_cov":
        loss = with_clip_cov(loss, algo.cov_ratio, algo.clip_cov_lb, algo.clip_cov_ub)
    elif algo.cov_control == "kl_cov":
        loss = with_kl_cov(loss, algo.cov_ratio, algo.kl_cov_coef, loss_aggregator(algo, max_new_tokens))
    if algo.entropy_coef > 0:
        loss = with_entropy_bonus(loss, algo.entropy_coef, loss_aggregator(algo, max_new_tokens))
    if algo.entropy_adv_coef > 0:  # outside the bonus: it hands the bonus the entropy
        loss = with_entropy_advantage(loss, algo.entropy_adv_coef, algo.entropy_adv_kappa)
    # ICEPOP is TIS with a mask for a cap (offpolicy.py): it takes TIS's place, stale samples included
    cap = 0.0 if algo.icepop_c else algo.tis_cap or (STALE_TIS_CAP if stale_samples else 0.0)
    if cap > 0:
        loss = with_tis(loss, cap, algo.tis_level)
    if algo.icepop_c:
        loss = with_icepop(loss, algo.icepop_c)
    if algo.offpolicy_mask_delta is not None:
        loss = with_offpolicy_mask(loss, algo.offpolicy_mask_delta)
    kl_control = (core.AdaptiveKLController(algo.kl_coef, algo.kl_target, algo.kl_horizon) if algo.kl_target > 0
                  else None)
    return Objective(policy, loss, algo.prime_coef, group_size, algo.overlong_filter, kl_control, turn_credit,
                     turn_discount)


def loss_aggregator(algo: AlgoConfig, max_new_tokens: int) -> core.Aggregator:
    """How the algorithm aggregates its policy loss, so the terms added to it (the entropy bonus)
    weigh tokens the same way: its fixed aggregator if it has one (GSPO's per-sequence loss -> the
    sequence mean of token means, as its KL term), else algo.loss_agg."""
    fixed = traits(algo.name).fixed_aggregator
    name = "seq_mean_token_mean" if fixed == "sequence" else fixed or algo.loss_agg
    return core.aggregator(name, max_new_tokens)


def loss_takes_entropy(algo: AlgoConfig) -> bool:
    """Whether the loss reads the trainer's per-token entropy (the entropy bonus, the entropy-shaped advantage)."""
    return algo.entropy_coef > 0 or algo.entropy_adv_coef > 0


def needs_old_logp_first(algo: AlgoConfig) -> bool:
    """Objective.old_logp_first from the algo section alone (the planner's view of the same rule)."""
    return old_logp_first(traits(algo.name), algo.kl_coef, algo.kl_target > 0)


def knobs_read(cls) -> set[str]:
    """The algo keys algorithm ``cls`` reads: what it declares beside its traits (``reads``); none for an
    algorithm of your own that declares nothing."""
    return set(getattr(cls, "reads", ()))


def ignored_knobs(algo: AlgoConfig) -> list[tuple[str, list[str]]]:
    """(key, the algorithms that read it) for every algo key set away from its default that another
    algorithm reads and algo.name does not: `rlpost train` refuses those, as sft, rm and dpo
    refuse keys they do not read, instead of running without them."""
    default = type(algo)()
    reads = {name: knobs_read(cls) for name, cls in ALGORITHMS.items()}
    mine = reads.get(algo.name)
    if mine is None:  # your own algorithm: what it reads is its business
        return []
    out = []
    for key in sorted(set().union(*reads.values()) - mine):
        if getattr(algo, key) != getattr(default, key):
            out.append((key, [name for name, keys in reads.items() if key in keys]))
    return out
