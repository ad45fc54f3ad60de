"""electra-compile with XLA's real TPU compiler (libtpu, the tpu extra) and GPU compiler (the CUDA plugin, the
gpu-compile extra) on this CPU-only machine: the commands' own steps compile for single- and multi-host slices, a batch
too large for HBM ends in one line naming one that fits (which then compiles), XLA's FLOPs stand beside flops.py's, and
a GPU step's kernels are counted by kind. The pre-training steps' compile for a GPU end to end is gpu_run's counts step
(tests/test_gpu_run.py), which runs the command for an H200."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from electra_jax.parallel import aot, topology
from tests import helpers

ROOT = helpers.ROOT
TINY_ENCODER = ["--config.model.num_layers=1", "--config.model.hidden_size=64", "--config.model.num_heads=2",
                "--config.model.intermediate_size=128", "--config.model.embedding_size=32"]


def compile_command(*flags, check=True) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "TPU_"))}  # as a user's shell has it
  result = subprocess.run([sys.executable, "-m", "electra_jax.compile", *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
  if check:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


def report(result) -> dict:
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("tpu, devices, hosts", [("v2-8", 8, 1), ("v3-32", 32, 4), ("v4-32", 16, 4), ("v5e-8", 8, 1),
                                                 ("v5e-16", 16, 4), ("v5p-8", 4, 1), ("v6e-256", 256, 64)])
def test_accelerator_types_describe_their_slices(tpu, devices, hosts):
  s = topology.parse(tpu)
  assert (s.num_devices, s.num_hosts) == (devices, hosts)
  assert len(s.devices()) == devices
  assert "TPU_ACCELERATOR_TYPE" not in os.environ  # programs started later do not take this machine for a TPU VM
  assert topology.parse("v5litepod-16") == topology.parse("v5e-16")
  assert [topology.parse(f"v4-{2 * c}").shape for c in (4, 8, 16, 32, 64, 128)] == [
      (2, 2, 1), (2, 2, 2), (2, 2, 4), (2, 4, 4), (4, 4, 4), (4, 4, 8)]  # Cloud TPU's v4/v5p slice shapes


@pytest.mark.slow
def test_pretraining_compiles_for_a_multi_host_slice_with_fsdp():
  result = report(compile_command("--config=configs/tiny.py", "--tpu=v4-32", "--config.train.batch_size=32",
                                  "--config.mesh.fsdp=2"))
  assert (result["devices"], result["hosts"]) == (16, 4)
  assert [s["step"] for s in result["steps"]] == ["train step", "eval step"]


@pytest.mark.slow
@pytest.mark.parametrize("tpu", ["v3-8", "v3-32"])
def test_finetuning_steps_compile_for_single_and_multi_host_slices(tpu):
  result = report(compile_command("--config=configs/finetune/classify.py", f"--tpu={tpu}", "--config.seq_len=64",
                                  *TINY_ENCODER))
  assert [s["step"] for s in result["steps"]] == ["train step", "predict step"]
  assert "classification" in result["what"] and "vocabulary 30522" in result["what"]


@pytest.mark.slow
def test_a_batch_too_large_for_hbm_ends_in_one_line_naming_one_that_compiles():
  """A 262144-wide feed-forward layer over 32 tokens: its activations make each row large, so few rows fill a v2 core.
  The compiles it takes (the miss, one row, the batch it names, then that batch again here) are the test's time, and
  TPU compile time grows with what the plan holds, not only with its bytes: dropout off (its random bits), a
  256-piece vocabulary (the generator's logits and sampling over 2000 pieces doubled the time of each fitting compile)
  and few wide rows (144 fit) rather than many narrow ones halved the test's time.

  The batch it names then compiles as any config does on a single-host slice: both steps the loop runs fit, and XLA
  counts more FLOPs than flops.py (which counts the matmuls only); the difference is what flops.py leaves out:
  elementwise work (GELU, layer norms, softmax) and the optimiser's update."""
  flags = ["--config=configs/tiny.py", "--tpu=v2-8", "--config.data.seq_len=32", "--config.data.vocab_size=256",
           "--config.model.intermediate_size=262144", "--config.model.dropout_rate=0",
           "--config.model.attention_dropout_rate=0", "--config.train.batch_size=8192"]
  failed = compile_command(*flags, check=False)
  helpers.assert_one_line_error(failed, "electra-compile: error: configs/tiny.py's train step needs ")
  line = failed.stderr.strip().splitlines()[-1]
  assert "at train.batch_size=8192 (1024 rows per device) where a v2-8 device has 7.48 GiB" in line
  suggested = int(line.split("the largest batch that fits is train.batch_size=")[1].split()[0])
  assert 8 <= suggested < 8192 and suggested % 8 == 0
  assert f"train.batch_size={suggested} ({suggested // 8} rows per device: it compiles)" in line
  fits = report(compile_command(*flags[:-1], f"--config.train.batch_size={suggested}"))
  assert fits["devices"] == 8 and fits["device_kind"] == "TPU v2" and fits["est_days_to_num_steps"] > 0
  train, evaluate = fits["steps"]
  assert (train["step"], evaluate["step"]) == ("train step", "eval step") and train["temp_bytes"] < 7.48 * 2**30
  for step in (train, evaluate):
    assert 0 < step["argument_bytes"] and 0 < step["peak_bytes"] < step["hbm_bytes"] == 8 * 2**30
  assert train["model_flops"] < train["xla_flops"] < 2 * train["model_flops"]
  assert 0 < train["est_step_s"] and 0 < train["est_mfu"] < 1 and train["est_tokens_per_sec"] > 0


@pytest.mark.parametrize("whole", [False, True], ids=["temporaries", "whole_plan"])
def test_the_fit_search_reads_misses_near_the_crossing(whole):
  """The search against a compiler stand-in whose temporaries grow more slowly than a line from one row predicts, so
  that line overshoots every time (a search along it ended at one row for Large on a v3-8): reading the slope off the
  two nearest misses, it lands on a batch that fits, near the largest, within its compiles; libtpu's late wording
  (the whole plan, weights included) is read net of what does not grow with the batch."""
  gib, fixed, hbm = 2**30, 3 * 2**30, 16 * 2**30

  def temps(rows):
    return int((0.2 + 0.12 * rows - 0.0002 * rows**2) * gib)

  largest = max(r for r in range(1, 257) if temps(r) <= hbm - fixed)
  compiled = []

  def compile_at(rows):
    compiled.append(rows)
    if temps(rows) > hbm - fixed:
      need, have = (temps(rows) + fixed, hbm) if whole else (temps(rows), hbm - fixed)
      raise aot.OutOfMemory("train step", need, have, whole, "out of HBM")
    return aot.Report("train step", 0, 0, fixed, 0, 0, temps(rows), 0, 0.0, None)

  need, have = (temps(256) + fixed, hbm) if whole else (temps(256), hbm - fixed)
  fit = aot.largest_fit(compile_at, aot.OutOfMemory("train step", need, have, whole, "out of HBM"), 256)
  assert temps(fit.rows_per_device) <= hbm - fixed and fit.rows_per_device >= 0.9 * largest, (fit, largest, compiled)
  assert len(compiled) <= 4 and compiled[0] == 1


def test_a_search_whose_tries_all_miss_names_the_one_row_batch_as_such():
  """Where the plan grows far faster than the batch, every try misses: the search ends at the one-row plan it compiled
  first and says that its tries missed, rather than calling one row the largest batch that fits."""
  gib, fixed, hbm = 2**30, 3 * 2**30, 16 * 2**30
  compiled = []

  def compile_at(rows):
    compiled.append(rows)
    if rows > 1:
      raise aot.OutOfMemory("train step", 14 * gib, hbm - fixed, False, "out of HBM")
    return aot.Report("train step", 0, 0, fixed, 0, 0, gib // 10, 0, 0.0, None)

  fit = aot.largest_fit(compile_at, aot.OutOfMemory("train step", 14 * gib, hbm - fixed, False, "out of HBM"), 256)
  assert (fit.rows_per_device, fit.missed) == (1, 3) and compiled[0] == 1 and len(compiled) == 4, (fit, compiled)


@pytest.mark.parametrize("spec, devices, hosts", [("h100", 1, 1), ("h200:8", 8, 1), ("a100:16", 16, 2)])
def test_gpus_describe_their_devices_and_memory(spec, devices, hosts):
  gpus = topology.parse_gpu(spec)
  found = gpus.devices()
  assert (len(found), gpus.num_hosts, len({d.process_index for d in found})) == (devices, hosts, hosts)
  assert found[0].platform == "gpu" and found[0].device_kind.startswith(f"NVIDIA {spec[:4].upper()}")
  memory = {"h100": 84942979072, "h200": 151397597184, "a100": 85100068864}[gpus.gpu]
  assert gpus.hbm_bytes_per_device == int(memory * topology.DEFAULT_MEM_FRACTION)  # JAX's allocator's share
  for bad in ("h300", "h100:12", "h100:0", "v3-8"):
    with pytest.raises(ValueError):
      topology.parse_gpu(bad)


def test_a_gpu_plan_beyond_the_memory_limit_is_out_of_memory_and_kernels_are_counted_by_kind():
  """XLA:GPU compiles a plan of any size: compile_step holds it to the limit, in the terms the fit search reads."""
  mesh = jax.make_mesh((1,), ("x",), devices=topology.parse_gpu("h100").devices())
  x = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=jax.sharding.NamedSharding(mesh, jax.P()))
  step = jax.jit(lambda a, b: jnp.sum(jax.nn.gelu(a @ b)))
  fits = aot.compile_step("train step", step, (x, x), memory_limit=2**30)
  assert fits.flops is None and fits.peak_bytes > 4 * 2**20
  kinds = fits.kernels
  assert kinds["gemm"] == 1 and kinds["reduction"] >= 1 and kinds["collective"] == kinds["cudnn"] == 0, kinds
  with pytest.raises(aot.OutOfMemory) as e:
    aot.compile_step("train step", step, (x, x), memory_limit=fits.peak_bytes - 1)
  assert (e.value.need_bytes, e.value.available_bytes, e.value.whole) == (fits.peak_bytes, fits.peak_bytes - 1, True)
