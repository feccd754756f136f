"""Ways to push the actor's weights into a running vLLM server, behind one interface.

- ``FileTransfer`` (``vllm_server_weight_transfer='file'``, the default): the trainer writes the weights as
  safetensors into a directory the server can read (the same machine, or a shared file system) and asks the server,
  through its development-mode ``/collective_rpc``, to ``reload_weights`` from it in place. Works on CPU and GPU;
  tested on CPU.
- ``NCCLTransfer`` (``'nccl'``): vLLM's own RL weight-transfer API (``/init_weight_transfer_engine``,
  ``/update_weights``), the trainer broadcasting each tensor over NCCL from GPU memory. GPUs only; untested (no GPU
  was available where steadyrl is tested).

Both go through the client, so every request carries the server's key and the run's id (``server_auth``); the NCCL
rendezvous itself (``vllm_group_port``) is plain NCCL, without authentication: only the trainer's hosts and the
server's may reach that port.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from abc import ABC, abstractmethod

import torch

from .. import compat
from ..reporting.quiet import quiet_vllm_logs
from .server_auth import run_id
from .server_client import ServerClient, VLLMServerError


class WeightTransfer(ABC):
    """Pushes a plain Hugging Face state dict into the server's model; called on the main process only."""

    def __init__(self, client: ServerClient) -> None:
        self.client = client

    @abstractmethod
    def push(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Make the server generate with ``weights`` (the actor as of global step ``version``)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the transfer holds."""

    def reloads(self) -> bool:
        """Whether ``reload`` can put the last pushed weights into the server again without the actor (a server
        restarted between two weight syncs)."""
        return False

    def reload(self, version: int) -> None:
        """Make the server generate again with the weights of ``version``, the last ones pushed (``reloads()``)."""
        raise VLLMServerError(
            f"{type(self).__name__} cannot put the weights of global step {version} into the vLLM server again without "
            "the actor (reloads() is False): a server that lost them stops the run"
        )


def unshared(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` on the CPU, a tensor that shares memory with an earlier one (tied embeddings) copied: safetensors
    refuses shared tensors, and vLLM's in-place reload needs every name (a tied ``lm_head.weight`` left out keeps
    its old values)."""
    seen, kept = set(), {}
    for name, tensor in weights.items():
        tensor = tensor.detach().cpu().contiguous()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        kept[name] = tensor.clone() if key in seen else tensor
        seen.add(key)
    return kept


class FileTransfer(WeightTransfer):
    """Writes ``weights_dir/v<version>/model.safetensors`` (via a temporary name, then renamed), has the server
    reload its weights from there in place and reset its prefix cache, then removes the older versions.

    Args:
        client: the server's client.
        weights_dir: a directory both the trainer and the server can read (and the trainer write).
        per_run: write into ``weights_dir/run-<run id>`` (a directory several runs share: none deletes another's
            versions).

    Example::

        transfer = FileTransfer(ServerClient("http://127.0.0.1:8000", 240), "out/vllm-server-weights")
        transfer.push(dict(model.state_dict()), version=3)
    """

    def __init__(self, client: ServerClient, weights_dir: str, per_run: bool = False) -> None:
        super().__init__(client)
        self.weights_dir, self.per_run = os.path.abspath(weights_dir), per_run
        # several servers' transfers share one (server_pool): the weights object each version was written from in
        # the push now going on, so that every server reads the one file; None: each push writes
        self.written: dict[str, int] | None = None

    def directory(self, create: bool = False) -> str | None:
        """Where the versions go (None: the run's own directory, before the run has an id and ``create`` is
        False)."""
        if not self.per_run:
            return self.weights_dir
        run = run_id(self.client.output_dir, create=create)
        return None if run is None else os.path.join(self.weights_dir, f"run-{run}")

    def push(self, weights: dict[str, torch.Tensor], version: int) -> None:
        from safetensors.torch import save_file

        directory = self.directory(create=True)
        os.makedirs(directory, exist_ok=True)
        final = os.path.join(directory, f"v{version}")
        if self.written is None or self.written.get(final) != id(weights) or not os.path.isdir(final):
            tmp = final + ".tmp"
            for stale in (tmp, final):
                shutil.rmtree(stale, ignore_errors=True)
            os.makedirs(tmp)
            save_file(unshared(weights), os.path.join(tmp, "model.safetensors"))
            os.replace(tmp, final)
            if self.written is not None:
                self.written[final] = id(weights)
        self.load(final)
        self.remove_versions(keep=f"v{version}")

    def reloads(self) -> bool:
        return True

    def reload(self, version: int) -> None:
        """The version this transfer wrote last stays on disk until the next push or ``close()``: the server reads it
        again. Any process of the run may call it (the directory is the same on every one)."""
        self.load(os.path.join(self.directory(create=True), f"v{version}"))

    def load(self, final: str) -> None:
        try:
            self.client.collective_rpc("reload_weights", {"weights_path": final})
        except VLLMServerError as err:
            if err.unreachable:
                raise
            raise VLLMServerError(
                f"{err}. The server could not load the actor's weights from {final}: it must be able to read that "
                "directory (set vllm_server_weights_dir to a path both see) and serve the same architecture"
            ) from err
        self.client.reset_prefix_cache()

    def remove_versions(self, keep: str | None = None) -> None:
        """Delete the versions this transfer wrote (``v<step>``, ``v<step>.tmp``) but ``keep``; anything else in
        ``weights_dir`` (a directory the user may have chosen) is left alone."""
        directory = self.directory()
        if directory is None or not os.path.isdir(directory):
            return
        for name in os.listdir(directory):
            if name != keep and re.fullmatch(r"v\d+(\.tmp)?", name):
                shutil.rmtree(os.path.join(directory, name), ignore_errors=True)

    def close(self) -> None:
        self.remove_versions()
        if (directory := self.directory()) is not None:
            with contextlib.suppress(OSError):  # only if nothing else is in it
                os.rmdir(directory)


class NCCLTransfer(WeightTransfer):
    """vLLM's NCCL weight transfer: the trainer joins a NCCL group with the server's workers (rank 0, on
    ``vllm_group_port``) once, then broadcasts every tensor per update while the server receives it through
    ``/update_weights``. The server must be started with ``--weight-transfer-config '{"backend": "nccl"}'``.
    Untested: no GPU was available where steadyrl is tested.

    Args:
        client: the server's client.
        host: the trainer's address as the server's workers reach it.
        group_port: the port of the NCCL rendezvous (TRL's ``vllm_group_port``).
    """

    def __init__(self, client: ServerClient, host: str, group_port: int) -> None:
        super().__init__(client)
        self.host, self.group_port = host, group_port
        self.engine = None

    def _start(self, source) -> None:
        quiet_vllm_logs()
        compat.require_tested("vllm")
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

        answer = self.client.request("GET", "/get_world_size", what="reading its world size")
        world_size = int(answer["world_size"]) + 1  # the server's workers and this trainer process
        init = NCCLTrainerInitInfo(master_address=self.host, master_port=self.group_port, world_size=world_size, rank=0)
        self.engine = NCCLTrainerWeightTransferEngine.trainer_init(
            init, client=keyed_sync_client(self.client), source=source
        )

    def push(self, weights: dict[str, torch.Tensor], version: int) -> None:
        source = DictSource(weights)
        if self.engine is None:
            self._start(source)
        self.engine.source = source
        self.engine.send_weights()
        self.client.reset_prefix_cache()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


def keyed_sync_client(client: ServerClient):
    """vLLM's HTTP weight-sync client (its routes and payloads), each request sent through ``client``: with the
    server's key and the run's id, which vLLM's own client does not send."""
    from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient

    class KeyedWeightSyncClient(HTTPVLLMWeightSyncClient):
        def _post(self, path: str, json: dict | None = None) -> None:
            client.request("POST", f"/{path}", json, what=f"{path}()")

    return KeyedWeightSyncClient(client.base_url, timeout=client.timeout)


def DictSource(weights: dict[str, torch.Tensor]):  # noqa: N802 - a class made on first use (vLLM is imported late)
    """vLLM's ``WeightSource`` over a plain state dict (tensors on the GPU the NCCL group uses)."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class _DictSource(WeightSource):
        def metadata(self) -> list:
            return [ParamMeta(name=name, dtype=t.dtype, shape=tuple(t.shape)) for name, t in weights.items()]

        def __iter__(self):
            return iter(weights.items())

    return _DictSource()
