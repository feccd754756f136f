"""Multi-turn rollouts with TRL's API: ``tools``, ``environment_factory`` and ``rollout_func``.

tools.py           the tools one rollout may call, and running a turn's tool calls (sync and async)
environments.py    ``environment_factory``: one environment per rollout, ``reset``, its methods as tools, rewards
chat_format.py     tool calls parsed from sampled ids, tool results as token ids, the append-only template check
turns.py           the tool-call loop on token ids: sampled ids + environment ids, and the mask between them
rollout_func.py    a user's ``rollout_func``: its output checked and turned into trajectories
"""

from .turns import Trajectories

__all__ = ["Trajectories"]
