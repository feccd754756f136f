"""docs/configuration.md, written from the config dataclasses of ``ALGORITHMS``: every field steadyrl declares, by
group (each field group's ``settings_group``) and by config class, with its type, default and ``help``.

    python -m steadyrl.trainers.config_reference > docs/configuration.md

tests/unit/trainers/config/test_config_reference.py fails when the committed page differs from what this writes.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

from transformers import TrainingArguments

from . import ALGORITHMS, OnPolicyConfig

COMMAND = "python -m steadyrl.trainers.config_reference > docs/configuration.md"
FIELD_GROUPS_MODULE = "steadyrl/trainers/config/field_groups.py"


def declared_names(cls: type) -> set[str]:
    """The fields ``cls`` declares itself (not those it inherits)."""
    return {name for name, kind in inspect.get_annotations(cls).items() if not str(kind).startswith("ClassVar")}


def field_owner(config_class: type, name: str) -> type:
    """The class that first declares the field ``name`` (outside ``TrainingArguments``): the group it belongs to."""
    for cls in reversed(config_class.__mro__):
        if not issubclass(TrainingArguments, cls) and name in declared_names(cls):
            return cls
    raise LookupError(f"{config_class.__name__}.{name} is not declared by steadyrl")


def group_title(cls: type) -> str:
    return cls.__dict__.get("settings_group", cls.__name__)


def steadyrl_fields(config_class: type) -> dict[type, list[dataclasses.Field]]:
    """``config_class``'s fields declared by steadyrl, by the group that declares them."""
    groups: dict[type, list[dataclasses.Field]] = {}
    for config_field in dataclasses.fields(config_class):
        declared_here = any(
            config_field.name in declared_names(cls)
            for cls in config_class.__mro__
            if not issubclass(TrainingArguments, cls)
        )
        if declared_here:
            groups.setdefault(field_owner(config_class, config_field.name), []).append(config_field)
    # The class's own fields first, then its groups as --help lists them (fields in reverse MRO order).
    order = sorted(groups, key=lambda cls: (cls is not config_class, -config_class.__mro__.index(cls)))
    return {cls: groups[cls] for cls in order}


def default_of(config_field: dataclasses.Field) -> Any:
    if config_field.default_factory is not dataclasses.MISSING:
        return config_field.default_factory()
    return config_field.default


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def written_type(config_class: type, name: str) -> str:
    """The field's type as the class that declares it writes it (``field.type`` is not: HfArgumentParser replaces it
    in place by the resolved type)."""
    return next(
        str(vars(cls)["__annotations__"][name])
        for cls in config_class.__mro__
        if name in vars(cls).get("__annotations__", {})
    )


def field_row(config_class: type, config_field: dataclasses.Field) -> str:
    name = config_field.name
    if name in {f.name for f in dataclasses.fields(TrainingArguments)}:
        name += " †"
    kind, default = cell(written_type(config_class, config_field.name)), cell(repr(default_of(config_field)))
    return f"| `{name}` | `{kind}` | `{default}` | {cell(config_field.metadata.get('help', ''))} |"


def field_table(config_class: type, config_fields: list[dataclasses.Field]) -> list[str]:
    rows = [field_row(config_class, config_field) for config_field in config_fields]
    return ["| Field | Type | Default | Description |", "|---|---|---|---|", *rows, ""]


class Headings:
    """GitHub's anchors for the page's headings (lower case, punctuation dropped, repeats numbered)."""

    def __init__(self):
        self.seen: dict[str, int] = {}

    def anchor(self, title: str) -> str:
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        count = self.seen.get(slug, 0)
        self.seen[slug] = count + 1
        return slug if count == 0 else f"{slug}-{count}"


def changed_fields(config_class: type, base_class: type) -> list[dataclasses.Field]:
    """The fields of ``base_class`` that ``config_class`` declares again, with another default or description."""
    base = {f.name: f for f in dataclasses.fields(base_class)}
    return [
        f
        for f in dataclasses.fields(config_class)
        if f.name in base
        and f.name in declared_names(config_class)
        and (repr(default_of(f)) != repr(default_of(base[f.name])) or f.metadata != base[f.name].metadata)
    ]


def config_sections(base_class: type, algorithms: dict[str, type]) -> list[tuple[str, str, list[str]]]:
    """(heading, its level, lines) of each section, in page order."""
    sections = [("OnPolicyConfig", "##", ["The fields every algorithm's config shares.", ""])]
    for cls, group in steadyrl_fields(base_class).items():
        sections.append((group_title(cls), "###", field_table(base_class, group)))
    for command, config_class in algorithms.items():
        intro = [f"`{config_class.__name__}` (`steadyrl {command}`): `OnPolicyConfig` plus the groups below.", ""]
        changed = changed_fields(config_class, base_class)
        if changed:
            intro += ["Fields of `OnPolicyConfig` it declares again, with its own default or meaning:", ""]
            intro += field_table(config_class, changed)
        sections.append((config_class.__name__, "##", intro))
        for cls, group in steadyrl_fields(config_class).items():
            if cls not in base_class.__mro__:
                sections.append((group_title(cls), "###", field_table(config_class, group)))
    return sections


def render(base_class: type, algorithms: dict[str, type]) -> str:
    """The Markdown page: ``base_class``'s groups, then what each of ``algorithms`` (command -> config) adds."""
    headings, sections = Headings(), config_sections(base_class, algorithms)
    anchors = [headings.anchor(title) for title, _, _ in sections]
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated from the config dataclasses by `{COMMAND}`; do not edit by hand. -->",
        "",
        "Every config is a `transformers.TrainingArguments`: its own fields (`output_dir`, `save_steps`, "
        "`report_to`, ...) work as in transformers, counted in global steps. Below is every field steadyrl adds, "
        "by group, as the dataclasses declare it (one mixin per group, in "
        f"[{FIELD_GROUPS_MODULE}](../{FIELD_GROUPS_MODULE})), with the text `--help` shows. On the command line a "
        "field is `--name value`; in a YAML config, `name: value`. A `None` default is resolved when the config "
        "is built, as its description says. † marks a `TrainingArguments` field that steadyrl declares again, "
        "with its own default or meaning.",
        "",
    ]
    for (title, level, _), anchor in zip(sections, anchors):
        indent = "" if level == "##" else "  "
        lines.append(f"{indent}- [{title}](#{anchor})")
    lines.append("")
    for title, level, body in sections:
        lines += [f"{level} {title}", "", *body]
    return "\n".join(lines).rstrip("\n") + "\n"


def configuration_page() -> str:
    """docs/configuration.md as the dataclasses give it today."""
    return render(OnPolicyConfig, {name: algorithm.config_class for name, algorithm in ALGORITHMS.items()})


if __name__ == "__main__":
    print(configuration_page(), end="")
