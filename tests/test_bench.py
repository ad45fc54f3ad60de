"""electra-bench and the HF-torch peer run on the tiny config; the FLOP formula matches a count from the param tree."""
import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import flax
import jax
import numpy as np
import pytest

from configs import tiny
from electra_jax.pretrain import experiment
from tests import pretrain_cli

ROOT = pathlib.Path(__file__).resolve().parents[1]

REQUIRED = ("tokens_per_sec", "step_time_s", "tflops_per_device", "mfu", "device", "config", "batch", "seq_len",
            "compile_s", "peak_memory_bytes", "jax", "attention_impl")


def bench_output(*args, shape=("--config.model.num_layers=1", "--config.data.seq_len=32")) -> str:
  """electra-bench's stdout on configs/tiny.py (`shape`: one layer, 32 tokens), on one device at XLA's
  fastest-compiling level (this is about the harness, not the speed)."""
  env = dict(os.environ, PYTHONPATH=str(ROOT), XLA_FLAGS=pretrain_cli.xla_flags(0))
  out = subprocess.run([sys.executable, "-m", "electra_jax.bench", "--config=configs/tiny.py", *shape, *args],
                       cwd=ROOT, env=env, capture_output=True, text=True, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


def bench(*args) -> dict:
  """The last line of bench_output: its JSON result."""
  return json.loads(bench_output(*args).strip().splitlines()[-1])


@pytest.mark.slow
def test_bench_reports_json():
  result = bench("--steps=2", "--warmup=1", "--config.train.batch_size=8")
  assert set(REQUIRED) <= result.keys()
  assert result["config"] == "tiny" and result["device"] == "cpu" and result["mfu"] is None
  assert result["attention_impl"] == "einsum"
  assert (result["batch"], result["seq_len"], result["num_devices"]) == (8, 32, 1)
  assert result["tokens_per_sec"] > 0 and result["tflops_per_device"] > 0 and result["compile_s"] > 0
  assert math.isclose(result["tokens_per_sec"] * result["step_time_s"], 8 * 32, rel_tol=1e-6)
  assert math.isclose(result["loop_tokens_per_sec"] * result["loop_step_time_s"], 8 * 32, rel_tol=1e-6)
  assert result["loop_resident_step_time_s"] > 0
  # FLOP/s of the window: one step's FLOPs per step time, not per window
  assert math.isclose(result["tflops_per_device"] * 1e12 * result["step_time_s"], result["step_flops"], rel_tol=1e-6)
  assert result["peak_memory_bytes"] >= result["argument_bytes"] > 0 and math.isfinite(result["loss"])
  # The compiled step's kernels by kind, counted as electra-compile counts them (aot.kernel_counts).
  assert 0 < result["fusions"] <= result["kernels"] == sum(result["kernel_kinds"].values())
  assert result["kernel_kinds"]["rng"] > 0 and result["kernel_kinds"]["collective"] == 0


@pytest.mark.slow
def test_bench_reports_fused_attention():
  lines = bench_output("--steps=1", "--warmup=0", "--config.train.batch_size=8", "--config.model.attention_impl=fused",
                       "--config.model.attention_dropout_rate=0").strip().splitlines()
  result = json.loads(lines[-1])
  assert result["attention_impl"] == "fused" and result["attention_kernel"] == "xla"  # cuDNN only on NVIDIA GPUs
  assert " fused attention (xla) on " in lines[-2]


@pytest.mark.slow
def test_bench_host_loop_reports_the_hosts_work(tiny_data):
  """--host_loop: electra-pretrain's loop around a step that costs nothing, two steps a dispatch."""
  config, _ = tiny_data
  cadence = [f"--config.train.{key}=2" for key in ("steps_per_dispatch", "log_every", "eval_every", "checkpoint_every")]
  lines = bench_output("--host_loop", f"--data_dir={config.data.data_dir}", "--steps=4", "--warmup=1", *cadence,
                       shape=()).strip().splitlines()
  result = json.loads(lines[-1])
  assert (result["host_steps"], result["steps_per_dispatch"], result["log_every"]) == (8, 2, 2)
  assert result["host_step_time_s"] >= result["host_cpu_time_s"] > 0 and result["host_log_dispatch_time_s"] > 0
  assert result["input_wait_s"] >= 0 and "on-device" in result["other_threads_cpu_s"]
  assert lines[-2].startswith("tiny: the loop's host work at batch 16 x 64, 2 steps a dispatch: ")


def test_bench_imports_without_tensorflow():
  code = "import sys; import electra_jax.bench, electra_jax.pretrain.loop; assert 'tensorflow' not in sys.modules"
  subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True)


@pytest.fixture(scope="module")
def peer_module():
  spec = importlib.util.spec_from_file_location("peer_torch", ROOT / "benchmarks" / "peer_torch.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("gather_head", [False, True])
def test_peer_step(peer_module, gather_head):
  import torch  # pylint: disable=g-import-not-at-top
  config = tiny.get_config()
  torch.manual_seed(0)
  model = peer_module.Peer(config, peer_module.SpecialIds(), gather_head).train()
  g, d = model.generator, model.discriminator
  assert d.electra.embeddings is g.electra.embeddings  # ELECTRA's shared embeddings
  assert g.generator_lm_head.weight is g.electra.embeddings.word_embeddings.weight
  assert g.config.hidden_size == config.model.hidden_size * config.model.generator_fraction
  opt = peer_module.optimizer(model, config.train)
  batch = peer_module.bench.synthetic_batch(np.random.default_rng(0), 4, config.data.seq_len, config.data.vocab_size,
                                            peer_module.SpecialIds())
  before = g.electra.embeddings.word_embeddings.weight.detach().clone()
  loss = model(*(torch.from_numpy(batch[k]).long() for k in ("input_ids", "segment_ids")))
  loss.backward()
  opt.step()
  assert torch.isfinite(loss) and 0 < loss.item() < 100
  assert not torch.equal(before, g.electra.embeddings.word_embeddings.weight)


def test_flops_match_a_count_of_the_param_tree():
  """6 × (2-D kernels) × the tokens they see, + the tied output matmul at the masked positions, + attention."""
  config = tiny.get_config()
  exp = experiment.create(config)
  params = jax.eval_shape(exp.sharded.init, jax.random.key(0)).params
  batch, seq_len = config.train.batch_size, config.data.seq_len
  tokens, masked = batch * seq_len, batch * int((config.objective.mask_prob + 0.005) * seq_len)
  flat = flax.traverse_util.flatten_dict(params)
  expected = 0
  for path, leaf in flat.items():
    if path[-1] == "kernel":
      assert leaf.ndim == 2, path
      expected += 6 * math.prod(leaf.shape) * (masked if path[0] == "generator_head" else tokens)
    if path[-2:] == ("query", "kernel"):  # QKᵀ and PV: 2 × 2·L²·hidden per sequence forward, × 3 with backward
      expected += 12 * seq_len ** 2 * leaf.shape[1] * batch
  vocab, emb = flat[("embeddings", "word_embeddings")].shape
  expected += 6 * vocab * emb * masked  # the generator's output layer: the tied word table, transposed
  assert {p[0] for p in flat} == {"embeddings", "generator", "discriminator", "generator_head", "discriminator_head"}
  assert exp.step_flops == expected
