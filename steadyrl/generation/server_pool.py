"""Generation on several vLLM servers of the same model (``vllm_server_base_url`` or ``vllm_server_host`` a
comma-separated list): OpenRLHF's ``vllm_num_engines``, as servers.

Each server is a ``VLLMServerBackend`` of its own (checked, claimed, waited for and given the weights again when it
restarts, as one server is). The pool splits every call's rows over them by position, row ``i`` to server
``i % N``; since a completion depends only on its seed and the weights, which server samples it does not change it,
so a run samples the same on any number of servers, and a resume may use another number. An update gathers the
actor's weights once, and the main process pushes them to every server in turn (the ``'file'`` transfer writes them
once: every server reads the same ``v<step>``).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

import torch
from accelerate import PartialState

from ..distributed.processes import on_main_process
from ..vision import ImageBatch
from .base import Generation, GenerationBackend
from .server_weights import FileTransfer
from .weights import whole_weights


def split_rows(count: int, servers: int) -> list[list[int]]:
    """The row indices each of ``servers`` samples: row ``i`` goes to server ``i % servers``."""
    return [list(range(k, count, servers)) for k in range(servers)]


class VLLMServerPool(GenerationBackend):
    """Samples on several vLLM servers at once, each update pushed to all of them.

    Args:
        members: one ``VLLMServerBackend`` per server, each built (and its server checked) already (its
            ``from_config`` builds the pool where a config lists several servers).

    Example::

        pool = VLLMServerPool([VLLMServerBackend(tokenizer, sampling, settings_of(url)) for url in urls])
        pool.sync_weights(model, version=0)
        generation = pool.generate(model, [[5, 6, 7], [5, 6, 8]], seeds=[1, 2])  # one row on each server
    """

    def __init__(self, members: list) -> None:
        super().__init__(members[0].tokenizer, members[0].settings)
        self.members = members
        self.capabilities = members[0].capabilities
        self._synced_version: int | None = None  # several servers take merged weights (from_config), never adapters

    # a vision-language model's run sets these on the backend (trainers/loop/vision_checks.py): every server's
    @property
    def suppressed(self) -> tuple[int, ...]:
        return self.members[0].suppressed

    @suppressed.setter
    def suppressed(self, value: tuple[int, ...]) -> None:
        for member in self.members:
            member.suppressed = value

    @property
    def processor(self):
        return self.members[0].processor

    @processor.setter
    def processor(self, value) -> None:
        for member in self.members:
            member.processor = value

    @property
    def max_model_len(self) -> int:
        return self.members[0].max_model_len

    @property
    def pushes(self) -> int:
        return self.members[0].pushes

    def sync_weights(self, model: torch.nn.Module, version: int) -> None:
        if version == self._synced_version:
            return
        with contextlib.ExitStack() as stack:
            weights = stack.enter_context(whole_weights(model, everywhere=False, merged=True))
            stack.enter_context(self.members[0].stops_cleanly())
            labels = on_main_process(PartialState(), lambda: self.push(weights, version))
        for member, label in zip(self.members, labels):
            member.pushed(label, version, version)
            member._synced_version, member._base_version = version, version
            member.pushes += 1
        self._synced_version = version

    def push(self, weights: dict[str, torch.Tensor], version: int) -> list[str]:
        """Push ``weights`` to every server (main process); return the label each now knows them by."""
        with self.written_once():
            return [member.push(weights, version) for member in self.members]

    def push_copy(self, weights: dict[str, torch.Tensor], version: int) -> None:
        with self.written_once():
            for member in self.members:
                member.push_copy(weights, version)

    @contextlib.contextmanager
    def written_once(self):
        """The 'file' transfers of one push write the weights once, every server reading that file."""
        written: dict[str, int] = {}
        transfers = [m.transfer for m in self.members if isinstance(m.transfer, FileTransfer)]
        for transfer in transfers:
            transfer.written = written
        try:
            yield
        finally:
            for transfer in transfers:
                transfer.written = None

    def forget_push(self) -> None:
        self._synced_version = None
        for member in self.members:
            member.forget_push()

    def generate(
        self,
        model: torch.nn.Module,
        prompt_ids: list[list[int]],
        seeds: list[int],
        images: ImageBatch | None = None,
        max_new_tokens: int | None = None,
    ) -> Generation:
        shares = [share for share in split_rows(len(prompt_ids), len(self.members)) if share]

        def sample(member, rows: list[int]) -> Generation:
            part = None if images is None else images.select(torch.tensor(rows))
            picked = [prompt_ids[i] for i in rows], [seeds[i] for i in rows]
            return member.generate(model, *picked, images=part, max_new_tokens=max_new_tokens)

        with ThreadPoolExecutor(max_workers=len(shares)) as threads:
            parts = list(threads.map(sample, self.members, shares))
        order = [i for share in shares for i in share]
        merged = Generation.concatenate(parts)
        stopped = None if any(part.stopped is None for part in parts) else [s for p in parts for s in p.stopped]
        at = {row: position for position, row in enumerate(order)}

        def in_order(values: list | None) -> list | None:
            return None if values is None else [values[at[row]] for row in range(len(order))]

        return Generation(in_order(merged.completion_ids), in_order(merged.logprobs), stopped=in_order(stopped))

    def close(self) -> None:
        with contextlib.ExitStack() as stack:  # every server's, whichever fails
            for member in self.members:
                stack.callback(member.close)

    def release(self) -> None:
        self._synced_version = None
        for member in self.members:
            member.release()
