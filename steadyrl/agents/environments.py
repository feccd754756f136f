"""``environment_factory`` as TRL's: one environment instance per rollout row (pooled and reset, never shared by two
rows of a rollout), ``reset(**row)`` whose string is appended to the last user message, its public methods exposed as
tools, and ``get_reward()`` as one more reward source. The dict form picks each row's environment by its
``environment`` column."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ..rewards import is_async_reward as is_async
from .tools import ToolBox

ENVIRONMENT_COLUMN = "environment"


def environment_methods(environment) -> list[Callable]:
    """The environment's tools: its public methods other than ``reset`` and ``get_reward`` (looked up on the class,
    so properties are not evaluated)."""
    names = [name for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)]
    return [getattr(environment, n) for n in names if n not in ("reset", "get_reward") and not n.startswith("_")]


class Environments:
    """The environments of a run: their factories by name (None: the single factory), a pool of instances, and
    each one's tools."""

    def __init__(self, environment_factory, tools: list[Callable]) -> None:
        self.multi = isinstance(environment_factory, dict)
        self.factories = dict(environment_factory) if self.multi else {None: environment_factory}
        self.pool: dict = {}
        self.reward_types: list[type] = []
        for name, factory in self.factories.items():
            label = "environment_factory" + (f"[{name!r}]" if self.multi else "")
            if not callable(factory):
                raise TypeError(
                    f"{label}={factory!r} is not callable: give a class or a function that returns an "
                    "environment instance (with a reset() method)."
                )
            instance = factory()
            if not callable(getattr(instance, "reset", None)):
                raise ValueError(
                    f"{label} made a {type(instance).__name__} without a reset() method: each environment needs "
                    "reset(**row) returning None or a string appended to the last user message."
                )
            self.pool[name] = [instance]
            if callable(getattr(type(instance), "get_reward", None)) and type(instance) not in self.reward_types:
                self.reward_types.append(type(instance))
        self.standalone = list(tools)
        self.current: list = []  # the instances of the rows being rolled out (TRL's trainer.environments)

    def check_dataset(self, dataset) -> None:
        """With the dict form, every example must name one of the environments (checked when the trainer is built
        where the column can be read at once; a streaming dataset is checked as its rows are drawn)."""
        if not self.multi or not hasattr(dataset, "__len__"):
            return
        columns = dataset.column_names
        names = dataset[ENVIRONMENT_COLUMN] if ENVIRONMENT_COLUMN in columns else None
        self.names_for({ENVIRONMENT_COLUMN: names} if names is not None else dict.fromkeys(columns), len(dataset))

    def names_for(self, columns: dict[str, list], rows: int) -> list:
        """Each row's environment name: from the ``environment`` column with the dict form, else None."""
        if not self.multi:
            return [None] * rows
        names = columns.get(ENVIRONMENT_COLUMN)
        if names is None:
            raise ValueError(
                f"environment_factory is a dict {list(self.factories)}, so each example needs an "
                f"'{ENVIRONMENT_COLUMN}' column naming its environment; the rows have columns {sorted(columns)}."
            )
        unknown = sorted({str(n) for n in names if n not in self.factories})
        if unknown:
            raise ValueError(
                f"examples name environment {unknown}, which is not among the environments passed to "
                f"environment_factory: it has {list(self.factories)}."
            )
        return list(names)

    def instances(self, names: list) -> list:
        """One instance per row, drawn from the pool (grown when a rollout needs more of one environment)."""
        handed: dict = {}
        chosen = []
        for name in names:
            pool, index = self.pool[name], handed.get(name, 0)
            if index == len(pool):
                pool.append(self.factories[name]())
            handed[name] = index + 1
            chosen.append(pool[index])
        self.current = chosen
        return chosen

    def reset(self, environments: list, prompts: list, columns: dict[str, list]) -> list:
        """Reset each row's environment with the row's columns (``prompt`` included, ``environment`` not, as TRL);
        a returned string is appended to the conversation's last message. Returns the new prompts."""
        prompts = list(prompts)
        for i, environment in enumerate(environments):
            row = {"prompt": prompts[i], **{k: v[i] for k, v in columns.items()}}
            if self.multi:
                row.pop(ENVIRONMENT_COLUMN, None)
            observation = environment.reset(**row)
            if observation is None:
                continue
            if not isinstance(prompts[i], list):
                prompts[i] = prompts[i] + str(observation)
                continue
            last = prompts[i][-1]
            prompts[i] = prompts[i][:-1] + [{**last, "content": last["content"] + str(observation)}]
        return prompts

    def tool_boxes(self, environments: list) -> list[ToolBox]:
        return [ToolBox(self.standalone + environment_methods(e)) for e in environments]

    def tools_of(self, name) -> list[Callable]:
        """The tools shown to the model for a row of environment ``name`` (its class's methods, unbound names)."""
        return self.standalone + environment_methods(self.pool[name][0])

    def reward_functions(self) -> list[Callable]:
        """One reward function per environment class that defines ``get_reward``, named after the class: a row's
        score is its environment's ``get_reward()``, or None (does not apply) for another environment's row."""
        functions = []
        for kind in self.reward_types:
            if is_async(kind.get_reward):

                async def reward(environments, _kind=kind, **kwargs):
                    return [await e.get_reward() if type(e) is _kind else None for e in environments]

            else:

                def reward(environments, _kind=kind, **kwargs):
                    return [e.get_reward() if type(e) is _kind else None for e in environments]

            reward.__name__ = reward.__qualname__ = kind.__name__
            functions.append(reward)
        return functions
