"""A checkpoint's manifest: the list of its files with their sizes and sha256, written last as its completion
marker, and the checks that make a checkpoint damaged (never resumed from, exported or pushed): no manifest, a
malformed one (fields, types, unsafe names, a global_step other than the directory's, a required file not listed),
or a directory that does not hold exactly the regular files it lists, each with its size and sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from ..durable import fsync_dir

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
STEP_PATTERN = re.compile(r"^(?:tmp-)?checkpoint-(\d+)$")  # a directory whose name gives the manifest's global_step
SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
STATE_FILE = "steadyrl_state.json"

# The files a manifest must list, by the manifest's "layout" ("a|b": either; "dir/": any file below dir).
# "steadyrl" is what checkpoint/checkpointer.py writes (for process 0 at least; every process adds its own
# <part>_<rank>.json (+ .safetensors) for each per-process part, rng_state among them, and under DeepSpeed ZeRO or
# FSDP2 optimizer_<rank>.pt instead of optimizer.pt); "transformers" is a plain transformers.Trainer checkpoint that
# CheckpointCallback adds a manifest to.
ACTOR_WEIGHTS = "model.safetensors|model.safetensors.index.json|adapter_model.safetensors|actor/"  # layout.py
REQUIRED_FILES = {
    "steadyrl": (
        "trainer_state.json",
        STATE_FILE,
        "scheduler.pt",
        "optimizer.pt|optimizer_0.pt",
        "rng_state_0.json",
        ACTOR_WEIGHTS,
    ),
    "transformers": ("trainer_state.json",),
}
REQUIRED_NAMES = {ACTOR_WEIGHTS: "the actor's weights (model.safetensors or adapter_model.safetensors, or actor/)"}
# Files each process writes for itself: a checkpoint holds them for processes 0..n-1, every kind alike.
RANK_FILE_PATTERN = re.compile(r"([a-z][a-z0-9_]*?)_(\d+)\.(?:json|pt|safetensors)")


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete, damaged, or does not fit the current run."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
        os.fsync(f.fileno())
    return digest.hexdigest()


def _regular_files(directory: Path) -> set[str]:
    """The relative names of every file below ``directory``, never following a link: a symlink (to a file or a
    directory) or a special file anywhere below it is a CheckpointError."""
    found, pending = set(), [directory]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                name = Path(entry.path).relative_to(directory).as_posix()
                if entry.is_symlink():
                    raise CheckpointError(f"{directory}: {name} is a symlink; a checkpoint holds only regular files")
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    found.add(name)
                else:
                    raise CheckpointError(f"{directory}: {name} is not a regular file; a checkpoint holds only those")
    return found


def write_manifest(
    directory: str | os.PathLike, global_step: int, layout: str | None = None, processes: int | None = None
) -> None:
    """Hash, fsync and list every file below ``directory``; the manifest is the completion marker.

    ``layout`` ("steadyrl" or "transformers", see REQUIRED_FILES) names the files the manifest must list; by
    default "steadyrl" when the directory holds steadyrl_state.json. ``processes``, when given, is recorded: the
    per-process files of exactly that many processes must be listed (a machine whose files are missing does not
    make a smaller checkpoint that verifies). A directory that could not verify (a symlink, a required file
    missing) is refused with a CheckpointError, before any manifest is written.
    """
    directory = Path(directory)
    tmp = directory / (MANIFEST_NAME + ".tmp")
    tmp.unlink(missing_ok=True)  # left by a write killed midway: it must not be listed
    names = sorted(_regular_files(directory) - {MANIFEST_NAME})
    if layout is None:
        layout = "steadyrl" if STATE_FILE in names else "transformers"
    files = {name: {"size": (directory / name).stat().st_size, "sha256": _sha256(directory / name)} for name in names}
    manifest = {"format": MANIFEST_FORMAT, "global_step": global_step, "layout": layout, "files": files}
    if processes is not None:
        manifest["processes"] = processes
    check_manifest(directory, manifest)
    for sub in sorted({(directory / name).parent for name in names} | {directory}):
        fsync_dir(sub)
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / MANIFEST_NAME)
    fsync_dir(directory)


def read_manifest(directory: Path) -> dict:
    """The parsed manifest of ``directory``; CheckpointError when it is absent or not valid JSON."""
    path = directory / MANIFEST_NAME
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError; deep nesting recurses
        raise CheckpointError(f"{path} is not valid JSON ({type(err).__name__}: {err})") from err


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_fields(path: Path, manifest) -> None:
    """The manifest's own shape: an object with an integer format and global_step, a known layout, files a dict."""
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path} holds a JSON {type(manifest).__name__}, not an object")
    for key in ("format", "global_step", "files"):
        if key not in manifest:
            raise CheckpointError(f"{path} has no '{key}' field")
    for key in ("format", "global_step"):
        if not _is_int(manifest[key]) or manifest[key] < 0:
            raise CheckpointError(f"{path}: '{key}' is {manifest[key]!r}; it must be a non-negative integer")
    if manifest["format"] != MANIFEST_FORMAT:
        raise CheckpointError(f"{path} has format {manifest['format']}; this steadyrl reads format {MANIFEST_FORMAT}")
    layout = manifest.get("layout", "steadyrl")  # absent: written before layouts, by a steadyrl trainer
    if not isinstance(layout, str) or layout not in REQUIRED_FILES:
        raise CheckpointError(f"{path}: 'layout' is {layout!r}; it must be one of {', '.join(REQUIRED_FILES)}")
    if not isinstance(manifest["files"], dict):
        raise CheckpointError(f"{path}: 'files' is a JSON {type(manifest['files']).__name__}, not an object")
    processes = manifest.get("processes", 1)  # absent: written before it was recorded
    if not _is_int(processes) or processes < 1:
        raise CheckpointError(f"{path}: 'processes' is {processes!r}; it must be a positive integer")


def _check_name(directory: Path, name: str) -> None:
    """A listed name is a plain relative POSIX path that stays inside ``directory``."""
    if name.startswith("/"):
        raise CheckpointError(f"{directory}: the manifest lists {name!r}, an absolute path outside the checkpoint")
    if "\\" in name:
        raise CheckpointError(f"{directory}: the manifest lists {name!r}, whose backslash is not a POSIX separator")
    parts = name.split("/")
    if ".." in parts:
        raise CheckpointError(f"{directory}: the manifest lists {name!r}, whose '..' leaves the checkpoint")
    if any(part in ("", ".") for part in parts) or "\0" in name or name == MANIFEST_NAME:
        raise CheckpointError(f"{directory}: the manifest lists {name!r}, which is not a file name inside it")


def _check_entry(directory: Path, name: str, entry) -> None:
    """A listed file's record: {"size": non-negative int, "sha256": 64 lowercase hex digits}."""
    if not isinstance(entry, dict):
        raise CheckpointError(f"{directory}: the manifest's entry for {name} is a JSON {type(entry).__name__}")
    size, digest = entry.get("size"), entry.get("sha256")
    if not _is_int(size) or size < 0:
        raise CheckpointError(f"{directory}: the manifest gives {name} the size {size!r}, not a byte count")
    if not isinstance(digest, str) or not SHA256_PATTERN.fullmatch(digest):
        raise CheckpointError(f"{directory}: the manifest gives {name} the sha256 {digest!r}, not 64 hex digits")


def _lists(names: set[str], choice: str) -> bool:
    return any(name.startswith(choice) for name in names) if choice.endswith("/") else choice in names


def _check_required(directory: Path, layout: str, names: set[str], processes: int | None = None) -> None:
    """Every file of REQUIRED_FILES[layout] is listed, and the per-process files cover processes 0..n-1 alike: n is
    ``processes`` when the manifest records it (each process's RNG and rank state then required), else the highest
    rank listed + 1."""
    for required in REQUIRED_FILES[layout]:
        choices = required.split("|")
        if not any(_lists(names, choice) for choice in choices):
            wanted = REQUIRED_NAMES.get(required) or " or ".join(
                f"a file under {c}" if c.endswith("/") else c for c in choices
            )
            raise CheckpointError(
                f"{directory}: the manifest does not list {wanted}, which a {layout} checkpoint holds"
            )
    ranks: dict[str, set[int]] = {}
    for name in names:
        if match := RANK_FILE_PATTERN.fullmatch(name):
            ranks.setdefault(match.group(1), set()).add(int(match.group(2)))
    if processes is None:
        processes = max((max(found) + 1 for found in ranks.values()), default=0)
    elif layout == "steadyrl":
        ranks.setdefault("rng_state", set())  # every process writes its own
    for stem, found in sorted(ranks.items()):
        if extra := sorted(found - set(range(processes))):
            raise CheckpointError(
                f"{directory}: the manifest lists a {stem} file of process(es) {extra}, but the checkpoint was "
                f"written by {processes} process(es)"
            )
        if missing := sorted(set(range(processes)) - found):
            raise CheckpointError(
                f"{directory}: the manifest lists files of {processes} processes but no {stem} file of "
                f"process(es) {missing}"
            )


def check_manifest(directory: str | os.PathLike, manifest) -> None:
    """Raise CheckpointError unless ``manifest`` is well formed for ``directory``: its fields and their types, safe
    file names, a global_step equal to the directory's step, and every file its layout requires. Reads no file."""
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    _check_fields(path, manifest)
    for name, entry in manifest["files"].items():
        _check_name(directory, name)
        _check_entry(directory, name, entry)
    named = STEP_PATTERN.match(directory.name)
    if named and int(named.group(1)) != manifest["global_step"]:
        raise CheckpointError(
            f"{path} says global_step {manifest['global_step']}, but the directory is named {directory.name}"
        )
    _check_required(directory, manifest.get("layout", "steadyrl"), set(manifest["files"]), manifest.get("processes"))


def verify_checkpoint(directory: str | os.PathLike, hashes: bool = True) -> dict:
    """Return the manifest if it is well formed and the directory holds exactly the regular files it lists, each
    with its recorded size and sha256; else raise CheckpointError (also for any file the directory cannot read).
    ``hashes=False`` skips the sha256s: a quick check that reads no file's content."""
    directory = Path(directory)
    try:
        return _verify(directory, hashes)
    except OSError as err:
        raise CheckpointError(f"{directory} cannot be read: {err}") from err


def _verify(directory: Path, hashes: bool) -> dict:
    if not (directory / MANIFEST_NAME).is_file() and not (directory / MANIFEST_NAME).is_symlink():
        raise CheckpointError(f"{directory} has no {MANIFEST_NAME}: it was not completely written")
    on_disk = _regular_files(directory)
    manifest = read_manifest(directory)
    check_manifest(directory, manifest)
    files = manifest["files"]
    unlisted = sorted(on_disk - set(files) - {MANIFEST_NAME})
    if unlisted:
        raise CheckpointError(
            f"{directory}: file {unlisted[0]} is not listed in the manifest; a checkpoint holds only the files it lists"
        )
    for name, expected in files.items():
        path = directory / name
        if name not in on_disk:
            raise CheckpointError(f"{directory}: file {name} listed in the manifest is missing")
        size = path.stat().st_size
        if size != expected["size"]:
            raise CheckpointError(f"{directory}: file {name} has {size} bytes, the manifest says {expected['size']}")
        if hashes and _sha256(path) != expected["sha256"]:
            raise CheckpointError(f"{directory}: file {name} does not match its sha256 in the manifest")
    return manifest
