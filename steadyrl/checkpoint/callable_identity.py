"""Identities of reward functions and judges that are the same in every process and run, for the run's fingerprint
(fingerprint.py): a name identifies a module-level function; partials, lambdas, closures and callable objects are
identified by what they hold; secrets (``redaction.is_secret``) are left out."""

from __future__ import annotations

import collections
import enum
import functools
import hashlib
import inspect
import json
import types
from collections.abc import Callable

import torch
from transformers.utils import logging

from ..redaction import is_secret

logger = logging.get_logger(__name__)

MAX_DEPTH = 4  # objects inside a callable object's attributes described at most this deep; deeper ones unchecked
SHOWN_LENGTH = 200  # characters of a value an identity shows; a longer one is shown as its digest


def _sha(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def callable_name(func) -> str:
    """``module.qualname`` of a function (of its class, for a callable object), as checkpoints list reward functions."""
    target = func if hasattr(func, "__qualname__") else type(func)
    return f"{getattr(target, '__module__', '?')}.{target.__qualname__}"


class CallableIdentifier:
    """What identifies a callable in every process and run (never an address): a module-level function or a class
    by ``module.qualname``; a ``functools.partial`` by its function and arguments; a lambda or nested function by
    its name, a digest of its code, its closure's values and the plain globals it reads; a bound method by its
    function and object; a callable object by its class and attributes. Values ``digest`` names (models,
    tokenizers) count by what it gives; secrets (arguments or attributes named like a token, key or password) are
    left out. ``identify`` collects the parts that cannot be recorded; ``warn_unchecked`` names them once."""

    def __init__(self, digest: Callable[[object], str | None] = lambda value: None) -> None:
        self.digest = digest
        self.unchecked: list[str] = []
        self._open: set[int] = set()  # objects being described: a reference back to one is a cycle, not a value

    def identify(self, func, where: str) -> str:
        if isinstance(func, functools.partial):
            args = [_shown(self.describe(value, f"{where}[{i}]")) for i, value in enumerate(func.args)]
            parts = [self.identify(func.func, where), *args, *_shown_items(self.mapping(func.keywords, where))]
            return f"functools.partial({', '.join(parts)})"
        if inspect.ismethod(func):
            return f"{self.identify(func.__func__, where)} of {_shown(self.describe(func.__self__, where))}"
        if inspect.isfunction(func):
            if "<" not in func.__qualname__:  # module-level: its name identifies it
                return callable_name(func)
            return f"{callable_name(func)}({', '.join(_shown_items(self.function_parts(func, where)))})"
        if inspect.isclass(func) or inspect.isbuiltin(func) or inspect.isroutine(func):
            return callable_name(func)
        return _shown(self.describe(func, where))

    def function_parts(self, func, where: str) -> dict:
        """A lambda or nested function: its code's digest, defaults, closure and the plain globals it reads."""
        code = func.__code__
        closure = {}
        for name, cell in zip(code.co_freevars, func.__closure__ or ()):
            try:
                closure[name] = cell.cell_contents
            except ValueError:  # a cell not yet filled
                closure[name] = None
        reads = {name: func.__globals__[name] for name in _global_names(code) if name in func.__globals__}
        plain = {name: value for name, value in reads.items() if _is_plain(value)}
        defaults = {"defaults": func.__defaults__, "kwdefaults": func.__kwdefaults__}
        defaults = {name: value for name, value in defaults.items() if value}
        return {
            "code": _code_digest(code),
            **self.mapping(defaults, where),
            **self.mapping(closure, where),
            **self.mapping(plain, where),
        }

    def mapping(self, values: dict, where: str) -> dict:
        items = sorted(values.items(), key=lambda item: str(item[0]))  # keys of any type
        return {str(k): self.describe(v, f"{where}.{k}") for k, v in items if not is_secret(str(k))}

    def describe(self, value, where: str):
        """``value`` as a JSON value that is the same in every process and run."""
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (enum.Enum, torch.dtype, torch.device)):
            return str(value)
        if id(value) in self._open:
            return "<cycle>"
        self._open.add(id(value))
        try:
            return self._describe(value, where)
        finally:
            self._open.discard(id(value))

    def _describe(self, value, where: str):
        if isinstance(value, (list, tuple, collections.deque)):
            return [self.describe(item, f"{where}[{i}]") for i, item in enumerate(value)]
        if isinstance(value, (set, frozenset)):
            return sorted((self.describe(item, where) for item in value), key=repr)
        if isinstance(value, dict):
            return self.mapping(value, where)
        digest = self.digest(value)
        if digest is not None:
            return digest
        if isinstance(value, functools.partial) or inspect.isroutine(value) or inspect.isclass(value):
            return self.identify(value, where)
        name, attributes = callable_name(type(value)), getattr(value, "__dict__", None)
        if attributes is None or len(self._open) > MAX_DEPTH:
            self.unchecked.append(f"{where} ({name})")
            return f"{name} unchecked"
        return f"{name}({', '.join(_shown_items(self.mapping(attributes, where)))})" if attributes else name

    def warn_unchecked(self) -> None:
        if self.unchecked:
            logger.warning(
                f"Cannot record {', '.join(self.unchecked)} in the run's fingerprint: a resume could use different "
                "ones without being refused. Give reward functions and judges plain values (numbers, strings, lists, "
                "dicts), models or tokenizers to have them checked."
            )


def _shown(value) -> str:
    """``value`` as an identity shows it: JSON, or a digest when it is long."""
    if isinstance(value, str) and not value.startswith(('"', "[", "{")):
        text = value
    else:
        text = json.dumps(value, sort_keys=True)
    return text if len(text) <= SHOWN_LENGTH else f"sha256:{_sha(text)}"


def _shown_items(values: dict) -> list[str]:
    return [f"{key}={_shown(value)}" for key, value in values.items()]


def _is_plain(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(map(_is_plain, value))
    return isinstance(value, dict) and all(isinstance(k, str) and _is_plain(v) for k, v in value.items())


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _code_digest(code: types.CodeType) -> str:
    """The code's bytecode, names and constants (nested code objects by their own digest; frozensets sorted, since
    their order follows the per-process string hash)."""

    def constant(value):
        if isinstance(value, types.CodeType):
            return _code_digest(value)
        if isinstance(value, (tuple, frozenset)):
            items = [constant(item) for item in value]
            return sorted(items, key=repr) if isinstance(value, frozenset) else items
        return repr(value)

    return _sha([code.co_code.hex(), code.co_names, code.co_varnames, code.co_freevars, constant(code.co_consts)])
