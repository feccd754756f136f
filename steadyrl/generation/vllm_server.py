"""Rollout generation on a separate, already running vLLM server (``vllm_mode='server'``).

The trainer checks the server before any work (it answers, takes the trainer's key, serves the trainer's model with
a long enough context, in the expected dtype and log-prob mode, and no other run holds it), claims it for its run as
it first pushes weights, with output_dir locked (``server_auth``: one server, one run; released when training or a
standalone ``evaluate()`` ends), pushes the actor's weights into it before each rollout that follows
an update (``server_weights``; for a LoRA actor whose adapter the server serves, the base weights once and then the
adapter only, over the authenticated API: ``server_adapters``), and sends one completion request per prompt row,
each with its own sampling seed, concurrently: the server batches them, and every completion depends only on its
seed and the weights, so a resumed run samples exactly what an uninterrupted one would, and the same as the
colocated engine. Each completion names the weights it expects; a server that goes away or restarts meanwhile is
waited for, claimed again and given the run's weights again before those requests are sent again
(``server_recovery``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import secrets
import time
from collections.abc import Iterator

import torch
from accelerate import PartialState

from ..distributed.fsdp import is_sharded
from ..distributed.processes import on_main_process
from ..ops.finite import refuse_nonfinite
from ..vision import ImageBatch
from .base import Capabilities, Generation, GenerationBackend, SamplingSettings, trim_completion
from .lora_sync import adapter_bytes, adapter_rank, adapter_state
from .server_adapters import ADAPTER_PREFIX
from .server_client import ServerClient, VLLMServerError
from .server_recovery import MAX_RECOVERIES, OnServer, complete_rows, gave_up, put_back, recoverable
from .server_settings import ServerSettings, check_server, served_adapter_rank, server_settings, server_urls
from .server_weights import FileTransfer, NCCLTransfer, WeightTransfer
from .vllm import engine_plan, images_of
from .vllm_images import check_expanded, data_url, engine_prompt, suppression
from .weights import whole_weights

logger = logging.getLogger(__name__)


def adapter_name(label: str, version: int) -> str:
    """The served name of the adapter pushed as ``label``: never another push's, nor a killed run's."""
    return f"{ADAPTER_PREFIX}{label}-v{version}"


class VLLMServerBackend(GenerationBackend):
    """Samples on a running vLLM server; ``sync_weights`` pushes the actor's weights into it.

    Args:
        tokenizer: the actor's tokenizer (its EOS ends completions).
        settings: the sampling settings.
        server: where the server is and what it must serve.
        transfer: how weights reach it (default: from ``server.weight_transfer``).

    Example::

        backend = VLLMServerBackend(tokenizer, SamplingSettings(max_new_tokens=64), server_settings)
        backend.sync_weights(model, version=0)
        generation = backend.generate(model, [[5, 6, 7]], seeds=[1234])
    """

    capabilities = Capabilities(
        returns_logprobs=True, weight_push=frozenset({"full", "adapter"}), pushes_copies=True, takes_images=True
    )

    def __init__(
        self, tokenizer, settings: SamplingSettings, server: ServerSettings, transfer: WeightTransfer | None = None
    ) -> None:
        super().__init__(tokenizer, settings)
        self.server = server
        self.client = ServerClient(server.base_url, server.timeout, output_dir=server.output_dir)
        # every process checks, so that a refusal stops each of them here; the claim waits for the first push
        self.base_name, vllm_config = check_server(self.client, server)
        self.served_name = self.base_name  # the base model's name, or the adapter's in adapter-only sync
        self.adapter_rank = served_adapter_rank(vllm_config, server, server.base_url)
        self._base_synced = False  # adapter-only sync: the base weights are on the server
        self._base_version: int | None = None  # adapter-only sync: the version whose base weights were pushed
        self._pusher = secrets.token_hex(8)  # this process, to the server (which of a run's processes pushes)
        self.on_server: OnServer | None = None  # the run's weights the server holds, once pushed
        self.claimed = False
        if transfer is None:
            transfer = (
                NCCLTransfer(self.client, server.group_host, server.group_port)
                if server.weight_transfer == "nccl"
                else FileTransfer(self.client, server.weights_dir, server.weights_per_run)
            )
        self.transfer = transfer
        self._synced_version: int | None = None
        self.pushes = 0

    @classmethod
    def from_config(cls, args, tokenizer, model, device, logprob_temperature):
        """One server's backend, or a ``VLLMServerPool`` of several (``vllm_server_base_url`` lists several)."""
        urls = server_urls(args.vllm_server_base_url, args.vllm_server_host, args.vllm_server_port)
        # the server's device is checked when it answers (served_adapter_rank)
        weight_push = cls.capabilities.weight_push if len(urls) == 1 else frozenset({"full"})
        plan = engine_plan(args, model, logprob_temperature, False, weight_push)
        members = []
        for url in urls:
            server = server_settings(args, plan.config, plan.max_model_len, plan.dtype, plan.logprobs_mode, url)
            server.adapter_rank = adapter_rank(model) if plan.adapter_only else None
            server.adapter_required = args.vllm_lora_sync == "adapter"
            members.append(cls(tokenizer, SamplingSettings.from_config(args), server))
        if len(members) == 1:
            return members[0]
        from .server_pool import VLLMServerPool

        return VLLMServerPool(members)

    @property
    def max_model_len(self) -> int:
        return self.server.max_model_len

    def sync_weights(self, model: torch.nn.Module, version: int) -> None:
        if version == self._synced_version:
            return
        if self.adapter_rank is not None and is_sharded(model):
            logger.info(
                "vllm_lora_sync: pushing merged weights to the vLLM server, not the adapter only: the actor "
                "is sharded by FSDP2, whose adapter steadyrl does not gather alone."
            )
            self.adapter_rank, self.served_name = None, self.base_name
        adapter_only = self.adapter_rank is not None
        # The main process pushes; the others wait for its outcome (no process generates before the server holds
        # the new weights), and a failed push raises on every process at once instead of leaving them at a barrier.
        whole = not (adapter_only and self._base_synced)  # merged sync: every time; adapter-only: the base once
        with contextlib.ExitStack() as stack:
            weights = None
            if whole:
                weights = stack.enter_context(whole_weights(model, everywhere=False, merged=not adapter_only))
            adapter = adapter_state(model) if adapter_only else None  # gathered on every process under ZeRO-3
            stack.enter_context(self.stops_cleanly())
            label = on_main_process(PartialState(), lambda: self.push(weights, version, adapter))
        if whole:
            self._base_version = version
        if adapter_only:
            self.served_name, self._base_synced = adapter_name(label, version), True
        self.pushed(label, version, self._base_version if adapter_only else version, adapter)
        self._synced_version = version
        self.pushes += 1

    def pushed(self, label: str, version: int, weights_version: int, adapter: tuple | None = None) -> None:
        """The server holds the run's weights ``label`` (every process): its completions expect them."""
        named = None if adapter is None else (adapter_name(label, version), *adapter)
        self.on_server = OnServer(label, version, weights_version, named)
        self.client.weights = label

    def push_copy(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Make the server sample with ``weights``, a copy of the actor's at ``version`` taken earlier (generation
        ahead of training: from a worker thread, one process). A LoRA actor's copy is merged: the server then
        serves the base model's name. It is pushed unless the server holds this very copy: after an evaluation's
        adapter-only sync the server holds ``version`` as base weights + adapter, which samples (in float rounding)
        otherwise than the merged copy a resumed run pushes."""
        if version != self._synced_version or self.served_name != self.base_name:
            with self.stops_cleanly():
                label = self.push(weights, version)
            self._synced_version, self.served_name, self._base_synced = version, self.base_name, False
            self.pushed(label, version, version)

    def forget_push(self) -> None:
        """Have the next ``sync_weights`` push (every process decides alike): copies were pushed since, from the
        worker thread of one process (generation ahead with several)."""
        self._synced_version = None

    def push(self, weights: dict[str, torch.Tensor] | None, version: int, adapter: tuple | None = None) -> str:
        """Claim the server and push ``weights`` (None: the base weights it holds) and ``adapter``; return the label
        the server now knows them by. A server that goes away meanwhile is waited for and pushed to again."""
        if weights is not None:
            refusal = f"Refused to push the actor's weights of step {version} to the vLLM server"
            refuse_nonfinite(weights.items(), refusal)
        label, attempt = secrets.token_hex(8), 0
        while True:
            try:
                # claimed again before its weights change: after close() released it, or a restart freed it
                self.client.claim(push=label, pusher=self._pusher)
                self.claimed = True
                if weights is not None:
                    self.transfer.push(weights, version)
                elif attempt and self._base_version is not None:  # a restarted server lost the base weights too
                    self.transfer.reload(self._base_version)
                if adapter is not None:
                    self.client.load_adapter(adapter_name(label, version), adapter_bytes(*adapter))
                    self.client.reset_prefix_cache()
                self.client.pushed(label)
                return label
            except VLLMServerError as err:
                if not recoverable(err) or attempt >= MAX_RECOVERIES or not self.transfer.reloads():
                    raise
                attempt += 1
                self.reconnect(err)
                logger.warning(
                    "The vLLM server at %s failed the weight push of global step %d (%s); it answers again: pushing "
                    "the weights again.",
                    self.server.base_url,
                    version,
                    err,
                )

    def reconnect(self, cause: VLLMServerError) -> float:
        """Wait up to ``vllm_server_timeout`` for the server to answer again, with the key it has now, and check it
        as at the start; return the deadline."""
        deadline = time.monotonic() + self.server.timeout
        try:
            self.client.wait_until_up(deadline)
        except VLLMServerError as err:
            raise gave_up(cause, self.server.timeout) from err
        self.client.reload_key()  # written before the server answers
        check_server(self.client, self.server)
        return deadline

    def restore(self, cause: VLLMServerError, interrupted: int) -> None:
        """After ``cause`` interrupted ``interrupted`` completion requests: have the server answer with the run's
        weights again (pushed again by this process, or awaited from another of the run's)."""
        deadline = self.reconnect(cause)
        if self.on_server is None:  # nothing pushed: no weights to expect
            return
        if not self.transfer.reloads():
            raise VLLMServerError(
                f"{cause}. The server may have lost the run's weights, which vllm_server_weight_transfer="
                f"{self.server.weight_transfer!r} cannot push again outside a weight sync"
            )
        if put_back(self.client, self.transfer, self.on_server, self._pusher, deadline):
            logger.warning(
                "The vLLM server at %s lost the run's weights during generation (%s): it answers again, holds the "
                "weights of global step %d again, and the %d interrupted completion requests are sent again with "
                "their seeds.",
                self.server.base_url,
                cause,
                self.on_server.version,
                interrupted,
            )

    @contextlib.contextmanager
    def stops_cleanly(self) -> Iterator[None]:
        """A server failure during the run: say that the run stopped there and how to go on."""
        try:
            yield
        except VLLMServerError as err:
            raise VLLMServerError(
                f"the run lost its vLLM server: {err}. It stopped here; the checkpoints already written are intact: "
                "once the server answers again, resume with resume_from_checkpoint=True",
                unreachable=err.unreachable,
                status=err.status,
            ) from err

    def sampling_settings(self) -> dict:
        s = self.settings
        settings = dict(
            max_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p or 0.0,
            repetition_penalty=s.repetition_penalty,
        )
        if s.regex is not None:
            settings["structured_outputs"] = {"regex": s.regex}
        if self.suppressed:  # a vision-language model's image tokens, never sampled
            settings["logit_bias"] = {str(token): bias for token, bias in suppression(self.suppressed).items()}
        return {**settings, **s.extra}  # generation_kwargs override the settings

    def request_body(self, prompt: list[int], seed: int, max_tokens: int | None = None) -> dict:
        request = dict(model=self.served_name, prompt=prompt, seed=seed, logprobs=0, return_token_ids=True)
        limit = {} if max_tokens is None else {"max_tokens": max_tokens}
        return {**self.sampling_settings(), **request, **limit}

    def image_request_body(self, prompt: list[int], images: list, seed: int) -> dict:
        """The body of vLLM's token-in token-out request for a prompt row with images (``vllm_images``)."""
        sampling = {**self.sampling_settings(), "seed": seed, "logprobs": 0}
        return dict(
            model=self.served_name,
            token_ids=engine_prompt(prompt, images, self.suppressed)["prompt_token_ids"],
            content_parts=[{"type": "image_url", "url": data_url(image)} for image in images],
            sampling_params=sampling,
            return_token_ids=True,
        )

    def _one(self, prompt: list[int], seed: int, max_tokens: int | None = None) -> tuple[list[int], list[float], bool]:
        """A row's completion ids, their log-probs, and whether it ended by itself (EOS or a stop), not at a limit."""
        choice = self.client.complete(self.request_body(prompt, seed, max_tokens))
        ids = trim_completion(list(choice["token_ids"]), self.tokenizer.eos_token_id)
        return ids, list(choice["logprobs"]["token_logprobs"][: len(ids)]), choice.get("finish_reason") != "length"

    def _one_with_images(self, row: tuple[list[int], list], seed: int) -> tuple[list[int], list[float], None]:
        prompt, images = row
        answer = self.client.generate_tokens(self.image_request_body(prompt, images, seed))
        check_expanded(prompt, answer["prompt_token_ids"], f"the vLLM server at {self.server.base_url}")
        choice = answer["choices"][0]
        ids = trim_completion(list(choice["token_ids"]), self.tokenizer.eos_token_id)
        return ids, [entry["logprob"] for entry in choice["logprobs"]["content"][: len(ids)]], None

    def generate(
        self,
        model: torch.nn.Module,
        prompt_ids: list[list[int]],
        seeds: list[int],
        images: ImageBatch | None = None,
        max_new_tokens: int | None = None,
    ) -> Generation:
        """``images``: the rows' image inputs, whose ``sources`` (the dataset's images) the server processes;
        ``max_new_tokens``: another limit than the settings' (a partial rollout's first segment, prompts of text)."""
        rows, one = prompt_ids, functools.partial(self._one, max_tokens=max_new_tokens)
        if images is not None:
            rows, one = list(zip(prompt_ids, images_of(images))), self._one_with_images
        with self.stops_cleanly():
            results = complete_rows(one, rows, seeds, self.server.concurrency, self.restore)
        stopped = None if images is not None else [ended for _, _, ended in results]
        return Generation([ids for ids, _, _ in results], [logprobs for _, logprobs, _ in results], stopped=stopped)

    def close(self) -> None:
        """Release what the transfer holds, and the server for other runs (a later ``sync_weights`` claims it
        again)."""
        try:
            self.transfer.close()
        finally:
            self.release()

    def release(self) -> None:
        """Free the server for other runs (a later ``sync_weights`` claims it again and pushes the weights anew)."""
        self._synced_version, self._base_synced = None, False  # another run may replace the weights meanwhile
        self.on_server, self.client.weights = None, None
        # also where this process never claimed: a resumed run pushes under the claim its killed incarnation left
        if PartialState().is_main_process:
            self.client.release()
        self.claimed = False
