"""What environment episodes (task.name=env or tools) need of the config, checked at load with
the rest of the task section (config.check_task calls ``check_env``)."""

from __future__ import annotations

import yaml

from rlpost.task_section import ENV_FAMILIES
from rlpost.types.errors import ConfigError


def check_env(cfg, families: list[str]) -> None:
    """What environment episodes need (task.name=env or tools)."""
    task = cfg.task
    if families[0] not in ENV_FAMILIES:  # task.agent, task.turn_credit and the rest elsewhere: task_section.READ_BY
        return
    if cfg.rollout.top_p < 1:
        raise ConfigError(f"rollout.top_p: task.name={task.name} does not yet carry the top-p threshold across an "
                          "episode's turns, so the trainer would score the full softmax; expected 1.0, "
                          f"got {cfg.rollout.top_p}")
    if task.name == "env" and not task.env.strip():
        raise ConfigError("task.env: task.name=env needs an environment: 'module:Class', or one of guess, search, "
                          "code_repair, 'verifiers:ENV_ID', 'textarena:ENV_ID'")
    if task.name == "agent":
        check_agent(task)
    elif task.verifier:
        raise ConfigError(f"task.verifier: task.name={task.name} is rewarded by its environment's step; expected it "
                          "empty (task.reward_funcs can add a reward on the episode's text)")
    try:
        args = yaml.safe_load(task.env_args) if task.env_args else {}
    except yaml.YAMLError as e:
        raise ConfigError(f"task.env_args: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(args, dict):
        raise ConfigError(f"task.env_args: expected a YAML mapping like '{{high: 50}}', got {task.env_args!r}")


def check_agent(task) -> None:
    """What task.name=agent needs: the agent, and rows (task.data, or task.env's own)."""
    module, _, name = task.agent.strip().rpartition(":")
    if not module or not name:
        raise ConfigError(f"task.agent: task.name=agent needs the agent as 'module:function' (fn(client, row)), got "
                          f"{task.agent!r}")
    if not task.data and not task.env.strip():
        raise ConfigError("task.data: task.name=agent needs rows to give the agent: task.data, or task.env naming an "
                          "environment with rows(split, n, seed) (guess, search)")
