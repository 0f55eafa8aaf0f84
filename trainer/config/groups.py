"""The agent -> worker-group plan of a recipe.

    plan = plan_worker_groups(cfg, ("solver", "checker"))   # agent -> worker group, validated

Worker groups (REFERENCE.md §5): each logical agent maps to a worker group (one model, its
optimiser and its rollout engine). By default each agent gets its own group (non-shared);
``shared: true`` puts agents that use the same model into one group; an agent's ``wg`` names its
group explicitly. The per-agent optimisation settings (:data:`WG_SETTINGS`) attach to the group, so
agents sharing a group must agree on them, or loading fails with a line that names both agents.

Per-agent LoRA (``lora:`` per agent, ``shared_base: true``): a third mode between shared and separate
weights. ``shared_base`` groups agents by model exactly as ``shared`` does (one worker group, one
frozen copy of the base in memory), but every agent of the group trains its own LoRA adapter with
its own optimiser state and its own :data:`ADAPTER_SETTINGS` (lr, warm-up, weight decay, betas, grad
clip, the adapter's shape), which may therefore differ between the agents of the group. ``lora:``
without ``shared_base`` trains one adapter per worker group (its agents share it, like ``shared``
shares full weights); ``shared`` and ``shared_base`` together are refused (pick one meaning).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from drmas_bench.files import safe_name
from drmas_bench.types import UserError
from drmas_trainer.config.train import ADAPTER_SETTINGS, WG_SETTINGS, AgentConfig, TrainConfig, parse_agent


@dataclass
class WorkerGroupPlan:
    """One worker group: its name, the agents it serves and their (agreed) settings."""

    name: str
    agents: list[str]
    settings: AgentConfig  # the group's settings (model resolved; sampling/wg of the first agent)
    adapters: dict[str, AgentConfig] = field(default_factory=dict)  # LoRA: adapter name -> its settings
    adapter_of: dict[str, str] = field(default_factory=dict)  # LoRA: agent -> the adapter serving it

    @property
    def lora(self) -> bool:
        return bool(self.adapters)


def agent_config(cfg: TrainConfig, agent: str) -> AgentConfig:
    """The effective settings of ``agent``: AgentConfig defaults < agent_defaults < agents[agent]."""
    base = parse_agent({**cfg.agent_defaults, **cfg.agents.get(agent, {})}, "config", f"agents.{agent}")  # checked
    if base.model is None:
        base = base.model_copy(update={"model": cfg.model})
    return base


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(str(s).rstrip("/")).name) or "model"


def plan_worker_groups(cfg: TrainConfig, workflow_agents: tuple[str, ...]) -> dict[str, WorkerGroupPlan]:
    """Map the workflow's agents to worker groups (module docstring); validate agreement.
    With LoRA, each group also gets its adapters: one per agent under ``shared_base`` (named after
    the agent, with the agent's own :data:`ADAPTER_SETTINGS`), else one per group (named after it)."""
    unknown = sorted(set(cfg.agents) - set(workflow_agents))
    if unknown:
        raise UserError(f"agents: unknown agent(s) {', '.join(unknown)} for workflow {cfg.workflow!r}; "
                        f"its agents: {', '.join(workflow_agents)}")
    settings = {a: agent_config(cfg, a) for a in workflow_agents}
    models = {s.model for s in settings.values()}
    groups: dict[str, WorkerGroupPlan] = {}
    own = ADAPTER_SETTINGS if cfg.shared_base else ()
    for agent in workflow_agents:
        s = settings[agent]
        if cfg.shared_base and s.lora is None:
            raise UserError(f"shared_base: true trains one LoRA adapter per agent, but agent {agent} has no lora "
                            f"settings; set agent_defaults.lora (e.g. {{rank: 16, alpha: 32}}) or agents.{agent}.lora")
        if s.wg:
            name = safe_name(s.wg, f"agents.{agent}.wg: worker group")  # it names models/<wg>, optim/<wg>.pt
        elif cfg.shared or cfg.shared_base:
            name = "shared" if len(models) == 1 else _slug(s.model)
        else:
            name = agent
        if name not in groups:
            groups[name] = WorkerGroupPlan(name, [agent], s)
        else:
            g = groups[name]
            for key in WG_SETTINGS:
                if key in own:
                    continue
                mine, theirs = getattr(s, key), getattr(g.settings, key)
                if mine != theirs:
                    raise UserError(f"agents {g.agents[0]} and {agent} share worker group {name!r} but disagree on "
                                    f"{key} ({theirs!r} vs {mine!r}); give them the same {key} or separate groups")
            g.agents.append(agent)
        g = groups[name]
        if s.lora is not None:
            adapter = safe_name(agent if cfg.shared_base else name, f"agent {agent}: LoRA adapter")
            g.adapters.setdefault(adapter, s)
            g.adapter_of[agent] = adapter
    return groups
