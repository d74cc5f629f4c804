"""The task section: what a run learns from (the task family, its data, verifier, reward stack and
environment), one frozen dataclass like every section in sections.py, which re-exports it; and
``knob``, the range-checked field every section's numbers use.

Its own file because it is the largest section: sections.py holds the rest. Each field's docstring
(the string literal under it) is its ``--help`` text; ranges and choices live next to the field,
in ``metadata``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal


def knob(default, *, ge=None, gt=None, le=None, lt=None):
    """A dataclass field with a numeric range checked at load time."""
    return field(default=default, metadata={"ge": ge, "gt": gt, "le": le, "lt": lt})


@dataclass(frozen=True)
class TaskConfig:
    name: Literal["arithmetic", "dataset", "math", "gym", "code", "tools", "env", "agent"] = "arithmetic"
    """task family (prompts, answers, verifier): arithmetic, dataset (task.data), math, gym (reasoning-gym), code,
    tools, env (task.env), agent (task.agent) (docs/options.md)"""
    mix: str = ""
    """several task families in one run, 'family:weight' comma-separated (e.g. 'arithmetic:0.7,gym:0.3'), each scored by
    its own verifier; empty = task.name alone (docs/options.md)"""
    ops: str = "+-*"
    """operators to draw from, e.g. '+', '+-', '+-*'"""
    min_a: int = knob(2, ge=0)
    """smallest first operand"""
    max_a: int = knob(20, ge=0)
    """largest first operand"""
    min_b: int = knob(2, ge=0)
    """smallest second operand"""
    max_b: int = knob(20, ge=0)
    """largest second operand"""
    n_terms: int = knob(2, ge=2, le=20)
    """operands per problem (a op b op c ...); operands after the first use the b range"""
    min_terms: int = knob(0, ge=0, le=20)
    """training problems draw their operand count from task.min_terms..task.n_terms, shorter ones more often; held-out
    ones all have task.n_terms; 0 = all have task.n_terms (docs/environments.md)"""
    prompt: str = "What is {expr}? Reply with only the number."
    """user message; {expr} is replaced by the expression, {steps} by its operations one per numbered line (+ and -
    only: docs/environments.md)"""
    system_prompt: str = ""
    """system message placed before the user message; empty = the chat template's default"""
    prompt_format: Literal["chat", "raw"] = "chat"
    """a data row's string prompt: chat = the user message of the chat template; raw = as it is, no template
    (docs/options.md)"""
    n_train: int = knob(4000, ge=1)
    """training problems (the stream cycles through them, reshuffled each epoch)"""
    n_heldout: int = knob(200, ge=1)
    """held-out problems, never trained on, for accuracy before/after; from task.data (no task.eval_data) the default is
    at most a tenth of the rows (docs/options.md)"""
    seed: int = 1234
    """seed of the problem generator; the held-out split is fixed by it"""
    max_contamination: float = knob(0.05, ge=0, le=1)
    """refuse to train when more than this share of held-out prompts is contained in training prompts (8-gram overlap);
    1 = do not check (docs/options.md)"""
    contamination_overlap: float = knob(0.8, gt=0, le=1)
    """the share of a held-out prompt's 8-grams one training prompt must contain for it to count as contaminated
    (docs/options.md)"""
    verifier: str = ""
    """'module:function' scoring (completion, row) -> (reward, info), replacing the task family's own; empty = the
    family's"""
    reward_model: str = ""
    """RLHF: the model folder written by `rlpost rm`; its score replaces the verifier's reward in training (held-out
    accuracy still uses the verifier)"""
    process_reward_model: str = ""
    """a process reward model folder whose score at the end of each step (line) becomes a dense reward on that step's
    last token; empty = off (docs/options.md)"""
    process_reward_coef: float = knob(1.0, ge=0)
    """weight of task.process_reward_model's step rewards"""
    process_reward_form: Literal["score", "delta"] = "score"
    """a process reward model's step reward: its score, or its change from the step before (delta) (docs/options.md)"""
    sandbox: Literal["bwrap", "rlimits"] = "bwrap"
    """task.name=code: how model-written code is isolated: bwrap (bubblewrap namespaces, refuses to start without it) or
    rlimits (limits and a per-run uid only) (docs/options.md)"""
    sandbox_allow_root: bool = False
    """task.sandbox=rlimits as root: refused unless true (bubblewrap keeps root out of the program's reach; rlimits does
    not)"""
    sandboxes: int = knob(0, ge=0)
    """task.name=code: sandboxes that may run at once on this machine, the tests of one completion and the completions
    of every verifier worker together; 0 = the number of CPU cores"""
    verifier_timeout_s: float = knob(0.0, ge=0)
    """seconds one verifier call may take before it scores 0 as a timeout; 0 = the family's default (2 s; 10 s math and
    gym; 60 s code) (docs/options.md)"""
    verifier_workers: int = knob(0, ge=0, le=256)
    """verifier worker processes scoring a batch in parallel (each reward function has its own); 0 = the CPU cores, at
    most 8 (docs/options.md)"""
    verifier_memory_mb: int = knob(0, ge=0)
    """address-space limit of each verifier worker (RLIMIT_AS), in MiB; 0 = the machine's memory / (workers + 1), at
    least 2048 (docs/options.md)"""
    max_reward_error_frac: float = knob(0.5, ge=0, le=1)
    """stop the run when a reward function fails on more than this fraction of a step's completions (or on the whole
    first batch) (docs/options.md)"""
    data: str = ""
    """training rows (dataset/math/code tasks): a .jsonl or .parquet file or a `datasets` folder saved on disk"""
    eval_data: str = ""
    """held-out rows, same format; empty = task.n_heldout rows of a seeded shuffle of task.data; alone: all of it, to
    evaluate (docs/options.md)"""
    prompt_column: str = "prompt"
    """data column holding the prompt: a string (becomes the user message) or a list of chat messages"""
    answer_column: str = "answer"
    """data column holding the reference answer (row['answer']); a dotted name reads a nested field; other columns reach
    the verifier (docs/options.md)"""
    on_bad_row: Literal["refuse", "skip"] = "refuse"
    """a malformed data row stops the run naming its line (refuse), or is skipped and counted (skip)"""
    gym_name: str = "basic_arithmetic"
    """task.name=gym: the reasoning-gym dataset name"""
    gym_config: str = ""
    """task.name=gym: the dataset's config as a YAML mapping, e.g. '{min_terms: 2, max_terms: 3}'"""
    reward_funcs: str = ""
    """training reward = weighted sum of these comma-separated 'module:function's (verifier-style or TRL-style); empty =
    the verifier alone (docs/options.md)"""
    reward_weights: str = ""
    """weights of task.reward_funcs, comma-separated; empty = all 1.0"""
    length_penalty: Literal["none", "linear", "ratio"] = "none"
    """length shaping added to the reward: linear = -coef * (tokens over length_target) / (max_new_tokens -
    length_target); ratio = Kimi k1.5's group-relative length reward (see rewards/stack.py)"""
    length_coef: float = knob(0.1, ge=0)
    """weight of task.length_penalty"""
    length_target: int = knob(0, ge=0)
    """linear length penalty: tokens allowed before the penalty starts"""
    judge_model: str = ""
    """LLM-as-judge reward: 'embedded' or a model folder (empty = off); its score joins the reward stack with weight
    task.judge_weight"""
    judge_mode: Literal["pointwise", "pairwise"] = "pointwise"
    """pointwise: a rubric score per response; pairwise: win rate against the group's other responses, order
    randomised"""
    judge_rubric: str = ""
    """the judge's rubric or constitution: text, or a path to a .md/.txt file; empty = the built-in helpfulness
    rubric"""
    judge_both_orders: bool = True
    """pairwise: judge each pair in both orders and average, cancelling position bias (2x the forwards)"""
    judge_weight: float = knob(1.0, ge=0)
    """weight of the judge's score in the reward stack"""
    tools: str = "calculator,python"
    """task.name=tools: tools the model may call, comma-separated (calculator, python)"""
    max_turns: int = knob(4, ge=1)
    """task.name=env or tools: model turns per episode, the last still given to the environment's step; agent: calls
    per episode, one more is refused"""
    max_episode_tokens: int = knob(192, ge=1)
    """task.name=env or tools: tokens per episode, model and environment tokens together (each model turn samples at
    most rollout.max_new_tokens); the episode ends there"""
    env: str = ""
    """task.name=env: the environment, 'module:Class' with reset(row) and step(message), or a shipped one (guess,
    search, code_repair, verifiers:ID, textarena:ID) (docs/options.md)"""
    env_args: str = ""
    """task.name=env: keyword arguments for the environment's class, as a YAML mapping, e.g. '{low: 1, high: 50}'"""
    env_timeout_s: float = knob(30.0, gt=0)
    """seconds one environment call (reset or step) may take; one past it is killed with its worker, and its episode
    ends with reward 0, counted in env/timeouts"""
    env_workers: int = knob(0, ge=0, le=64)
    """environment worker processes stepping episodes while the sampler decodes others; 0 = the number of CPU cores, at
    most 8"""
    agent: str = ""
    """task.name=agent: 'module:fn' with fn(client, row) -> reward, per-call rewards or a transcript, run against an
    OpenAI client on the run's endpoint (docs/environments.md, "Agents")"""
    agent_timeout_s: float = knob(300.0, gt=0)
    """task.name=agent: seconds one episode (the whole fn call) may take; one past it is killed with its worker, and
    its episode ends with reward 0, counted in env/timeouts"""
    agent_join: bool = True
    """task.name=agent: a model call that arrives during a decode joins it rather than waiting for the next; false
    pays on short, even turns (benchmarks/README.md)"""
    turn_credit: Literal["episode", "turn"] = "episode"
    """environment episodes, group algorithms: which tokens a turn's reward reaches: episode (the episode's return) or
    turn (the return from that turn on) (docs/options.md)"""
    turn_discount: float = knob(1.0, ge=0, le=1)
    """discount per turn in an episode's return: G_k = r_k + turn_discount * G_(k+1)"""


# Which task keys each family reads, for the keys some family does not: every key not named here is read by
# every family. A key set away from its default that no family of the run reads would be ignored, so it is
# refused (config.check_task: ``ignored_task_keys``), as an algo key its algorithm does not read is.
# tests/test_config.py holds the generated families to it: each one's split builder reads its own generator keys
# and no key the table gives only to other families.
ENV_FAMILIES = ("env", "tools", "agent")  # multi-turn episodes: of an environment (roles/rollout_env.py), of an agent
READ_BY = {
    **dict.fromkeys(("ops", "min_a", "max_a", "min_b", "max_b", "n_terms", "min_terms", "prompt"), ("arithmetic",)),
    "gym_name": ("gym",), "gym_config": ("gym",),
    # the code task's sandbox; the tools' python and code_repair's attempts take theirs from their own arguments
    "sandbox": ("code",), "sandbox_allow_root": ("code",), "sandboxes": ("code",),
    "tools": ("tools",),
    "env": ("env", "agent"),  # an agent may play task.env's rows; task.name=tools is its own environment
    **dict.fromkeys(("env_args", "env_timeout_s", "env_workers", "max_turns", "max_episode_tokens", "turn_credit",
                     "turn_discount"), ENV_FAMILIES),
    "agent": ("agent",),
    **dict.fromkeys(("agent_timeout_s", "agent_join"), ("agent", "env")),  # env: verifiers' episodes are agents
}
# Keys read only while another key turns their feature on: {key: (the switch, whether it is on, what it needs)}.
SWITCHED = {
    **{k: ("judge_model", lambda t: bool(t.judge_model), "task.judge_model set")
       for k in ("judge_mode", "judge_rubric", "judge_both_orders", "judge_weight")},
    **{k: ("process_reward_model", lambda t: bool(t.process_reward_model), "task.process_reward_model set")
       for k in ("process_reward_coef", "process_reward_form")},
    "length_coef": ("length_penalty", lambda t: t.length_penalty != "none", "task.length_penalty=linear or ratio"),
    "length_target": ("length_penalty", lambda t: t.length_penalty == "linear", "task.length_penalty=linear"),
    **{k: ("data", lambda t: bool(t.data or t.eval_data), "task.data or task.eval_data")
       for k in ("prompt_column", "answer_column")},
}


def ignored_task_keys(task: TaskConfig, families: list[str], what: str) -> list[str]:
    """A line for each task key set away from its default that no family of the run reads (READ_BY) or
    whose feature is off (SWITCHED); ``what`` names the run's families ('task.name=gym')."""
    default, out = TaskConfig(), []
    for key in (f.name for f in fields(TaskConfig)):
        if getattr(task, key) == getattr(default, key):
            continue
        readers = READ_BY.get(key)
        if readers and not set(readers) & set(families):
            named = " or ".join(", ".join(readers).rsplit(", ", 1))
            out.append(f"task.{key}: applies to task.name={named}, not {what}, which would ignore it; remove it")
        elif key in SWITCHED and not SWITCHED[key][1](task):
            switch, _, needs = SWITCHED[key]
            out.append(f"task.{key}: read only with {needs} (task.{switch} is {getattr(task, switch)!r}), so it would "
                       "be ignored; remove it")
    return out
