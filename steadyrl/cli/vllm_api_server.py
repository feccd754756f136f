"""The vLLM API server ``steadyrl vllm-serve`` runs for a vision-language model: vLLM's own
(``vllm.entrypoints.openai.api_server``), with the Qwen2-VL family made loadable without torchvision first
(``generation.vllm_images.without_torchvision``). vLLM's CPU backend starts its engine core and workers with
multiprocessing's spawn, which imports the main module of the process that starts them, this one, before anything
else: every process of the server runs the same models."""

from ..generation.vllm_images import without_torchvision

without_torchvision()

if __name__ == "__main__":
    import runpy

    # the main module stays this one (alter_sys=False), for the processes spawned from it
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=False)
