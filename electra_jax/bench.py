"""electra-bench: the speed of one training step (and, with --pipeline, of the input pipeline) for a config.

  electra-bench --config=configs/small.py --config.train.batch_size=32 --config.model.dtype=float32 [--steps=10]
  electra-bench --config=configs/demo.py --data_dir=data/demo --pipeline   # real ids; the input pipeline's speed too
  electra-bench --config=configs/small.py --data_dir=data/demo --host_loop --steps=300

Compiles the step (time, memory, kernels), times --steps steps on device-resident batches (synthetic, or the prepared
data's under --data_dir), then as the training loop drives them; --host_loop times electra-pretrain's loop around a
step that costs nothing. The last line is one JSON object (docs/benchmarks.md). Whether a config fits: electra-compile.
"""
import collections
import dataclasses
import gc
import itertools
import json
import os
import tempfile
import threading
import time

import numpy as np
from absl import flags
from ml_collections import config_flags

from electra_jax import cli

NUM_BATCHES = 4  # distinct device-resident batches cycled through the timed window
PROFILE_STEPS = 3  # traced with --profile, after the timed window (tracing slows the host)


def define_flags():
  return [
      config_flags.DEFINE_config_file("config", None, "Config file (Python, get_config()).", lock_config=True),
      flags.DEFINE_integer("steps", 10, "Timed steps (dispatches: of train.steps_per_dispatch steps each)."),
      flags.DEFINE_integer("warmup", 3, "Untimed steps after compiling."),
      flags.DEFINE_string("data_dir", None, "Draw token ids from the prepared dataset here (config.data.data_dir)."),
      flags.DEFINE_bool("pipeline", False, "Also time the input pipeline alone on the prepared data."),
      flags.DEFINE_integer("pipeline_batches", 50, "Batches timed with --pipeline."),
      flags.DEFINE_string("profile", None, f"Also trace {PROFILE_STEPS} steps after the timed window into this dir."),
      flags.DEFINE_bool("host_loop", False, "Time the host's work in electra-pretrain's loop instead (needs data).")]


def config_name() -> str:
  """The config file's name without .py ("small" for configs/small.py)."""
  return os.path.splitext(os.path.basename(config_flags.get_config_filename(flags.FLAGS["config"])))[0]


def synthetic_batch(rng, batch_size: int, seq_len: int, vocab_size: int, special) -> dict:
  """Random in-vocab ids laid out like packed pre-training data: [CLS] A [SEP] B [SEP], some rows shorter and padded."""
  ids = rng.integers(max(special) + 1, vocab_size, (batch_size, seq_len), dtype=np.int32)
  seg = np.zeros_like(ids)
  for row in range(batch_size):
    length = seq_len if rng.random() < 0.9 else int(rng.integers(seq_len // 4, seq_len))
    split = int(rng.integers(2, length - 1))
    ids[row, 0], ids[row, split], ids[row, length - 1] = special.cls, special.sep, special.sep
    seg[row, split + 1:length] = 1
    ids[row, length:] = special.pad
  return {"input_ids": ids, "segment_ids": seg}


def host_batches(config, special, prepared=None) -> list:
  """NUM_BATCHES host batches: synthetic, or the first ones of the training stream of `prepared`."""
  if prepared is None:
    rng = np.random.default_rng(0)
    return [synthetic_batch(rng, config.train.batch_size, config.data.seq_len, config.data.vocab_size, special)
            for _ in range(NUM_BATCHES)]
  from electra_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  it = input_pipeline.train_iterator(config, prepared)
  batches = [next(it) for _ in range(NUM_BATCHES)]
  it.close()
  return batches


def memory_report(compiled) -> dict:
  """Bytes of the compiled step per device: arguments + outputs not aliased to (donated) arguments + temporaries."""
  m = compiled.memory_analysis()
  if m is None:
    return {}
  return dict(argument_bytes=m.argument_size_in_bytes, output_bytes=m.output_size_in_bytes,
              alias_bytes=m.alias_size_in_bytes, temp_bytes=m.temp_size_in_bytes, peak_memory_bytes=(
                  m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes))


def time_steps(exp, config, special, prepared=None, steps: int = 10, warmup: int = 3, profile: str | None = None
               ) -> dict:
  """Compile time, memory and step time of `exp.step` (`steps` steps after `warmup`), then as the loop drives it."""
  import jax  # pylint: disable=g-import-not-at-top
  from electra_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  from electra_jax.model import flops  # pylint: disable=g-import-not-at-top
  from electra_jax.parallel import aot  # pylint: disable=g-import-not-at-top
  rng = jax.random.key(config.train.seed)
  t0 = time.perf_counter()
  state = jax.block_until_ready(exp.sharded.init(rng))
  init_s = time.perf_counter() - t0  # compiling the initialisation, mostly: part of every fresh run's start-up
  k = exp.steps_per_dispatch  # each call below runs k steps on k stacked batches
  host = host_batches(config, special, prepared)
  stacks = [input_pipeline.stack([host[(i * k + j) % len(host)] for j in range(k)]) for i in range(len(host))]
  batches = [input_pipeline.to_global(b, exp.step_batch) for b in (host if k == 1 else stacks)]
  t0 = time.perf_counter()
  compiled = exp.step.lower(state, batches[0], rng).compile()
  result = dict(init_s=init_s, compile_s=time.perf_counter() - t0, **memory_report(compiled),
                param_arrays=len(jax.tree.leaves(state.params)), **aot.kernel_counts(compiled.as_text()))

  def run_steps(state, n: int, step_metrics=None):
    for i in range(n):
      state, step_metrics = compiled(state, batches[i % len(batches)], rng)
    return jax.block_until_ready((state, step_metrics))

  state, _ = run_steps(state, warmup)
  t0 = time.perf_counter()
  state, step_metrics = run_steps(state, steps)
  seconds = time.perf_counter() - t0
  # As the training loop drives it: on the resident batches, then on batches placed ahead by OnDevice's thread.
  stream = input_pipeline.train_iterator(config, prepared) if prepared else itertools.cycle(host)
  placed = input_pipeline.OnDevice(stream, exp.step_batch, steps=k)
  state, step_metrics = jax.block_until_ready(exp.step(state, next(placed), rng))  # fills jit's cache, starts input
  state, resident_seconds = loop_window(exp.step, state, itertools.cycle(batches), rng, steps)
  state, loop_seconds = loop_window(exp.step, state, placed, rng, steps)
  placed.close()
  result.update(loop_step_time_s=loop_seconds / (steps * k),
                loop_tokens_per_sec=config.train.batch_size * config.data.seq_len * steps * k / loop_seconds,
                loop_resident_step_time_s=resident_seconds / (steps * k))
  if profile:
    with jax.profiler.trace(profile, create_perfetto_trace=True):
      state, step_metrics = run_steps(state, PROFILE_STEPS)
    result["profile_steps"] = PROFILE_STEPS
  return dict(result, step_time_s=seconds / (steps * k), steps=steps * k, steps_per_dispatch=k, warmup=warmup,
              loss=float(np.reshape(step_metrics["loss"], -1)[-1]),
              **flops.throughput(exp.step_flops, config.train.batch_size * config.data.seq_len, steps * k, seconds))


def loop_window(step, state, batches, rng, steps: int):
  """(state, seconds) of `steps` calls of the jitted `step` on `batches` as the training loop makes them."""
  from electra_jax.run import loop  # pylint: disable=g-import-not-at-top
  pending = collections.deque()
  loop.collect(started=True, scheduled=False)
  t0 = time.perf_counter()
  for _ in range(steps):
    state, metrics = step(state, next(batches), rng)
    pending.append(metrics)
    if len(pending) > 2:
      np.asarray(pending.popleft()["loss"])
  for metrics in pending:
    np.asarray(metrics["loss"])
  seconds = time.perf_counter() - t0
  gc.unfreeze()
  gc.enable()
  return state, seconds


def time_pipeline(config, prepared, num_batches: int) -> dict:
  """Batches/s of the input pipeline alone, host batch to global device arrays, after a few warm-up batches."""
  import jax  # pylint: disable=g-import-not-at-top
  from electra_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  from electra_jax.parallel import sharding  # pylint: disable=g-import-not-at-top
  target = sharding.batch_sharding(sharding.create_mesh(**config.mesh))
  it = input_pipeline.train_iterator(config, prepared)
  for _ in range(3):
    next(it)
  t0 = time.perf_counter()
  for _ in range(num_batches):
    batch = input_pipeline.to_global(next(it), target)
  jax.block_until_ready(batch)
  seconds = time.perf_counter() - t0
  it.close()
  return dict(pipeline_batches_per_sec=num_batches / seconds,
              pipeline_tokens_per_sec=num_batches * config.train.batch_size * config.data.seq_len / seconds)


def time_host_loop(exp, prepared, steps: int, warmup: int) -> dict:
  """The host's time, CPU and input wait a step in electra-pretrain's loop around a step that costs nothing."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from electra_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from electra_jax.pretrain import experiment  # pylint: disable=g-import-not-at-top
  from electra_jax.pretrain import loop as pretrain_loop  # pylint: disable=g-import-not-at-top
  from electra_jax.pretrain import plan as plan_lib  # pylint: disable=g-import-not-at-top
  from electra_jax.run import goodput  # pylint: disable=g-import-not-at-top
  from electra_jax.run import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  config = exp.config
  config.unlock()
  k = exp.steps_per_dispatch
  config.train.num_steps = (warmup + steps + 1) * k  # the last dispatch's evaluation and save fall outside the window
  config_lib.check_counts(config.train, "num_steps", "eval_every")  # as electra-pretrain's plan checks them
  (_, _, (_, batch, _)), _ = experiment.compile_targets(exp)
  _, shapes = jax.eval_shape(exp.step, exp.sharded.abstract(), batch, jax.random.key(0))
  metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  free = dataclasses.replace(exp.sharded, batch=exp.step_batch).jit_step(
      lambda state, batch, rng: (state.replace(step=state.step + k), metrics))
  marks = []  # (wall, main thread's CPU, input wait so far, other threads' CPU by kind) at each dispatch

  def step(state, batch, rng):
    if len(marks) == 1:  # the window opens once the evaluation step has compiled (run/loop.compile_ahead)
      for thread in threading.enumerate():
        if thread.name.startswith("compile-ahead"):
          thread.join()
    marks.append((time.perf_counter(), time.thread_time(), clock.seconds["input"],
                  _threads_cpu() if len(marks) in (warmup, warmup + steps) else None))
    return free(state, batch, rng)

  clock = goodput.Clock()
  with tempfile.TemporaryDirectory() as workdir, workdir_lib.Lock(workdir, "electra-bench") as lock:
    pretrain_loop.drive(exp, prepared, workdir, lock, clock, plan_lib.Start(), step_fn=step)
  (t0, cpu0, input0, threads0), (t1, cpu1, input1, threads1) = marks[warmup], marks[warmup + steps]
  # Each interval holds its dispatch's after_step: per step, a dispatch's time over its k steps.
  intervals = np.diff([m[0] for m in marks[warmup:warmup + steps + 1]]) / k
  logs = (np.arange(warmup + 1, warmup + steps + 1) * k % config.train.log_every) == 0
  n = steps * k
  return dict(host_steps=n, steps_per_dispatch=k, host_step_time_s=(t1 - t0) / n,
              host_step_median_s=float(np.median(intervals[~logs])),
              host_log_dispatch_time_s=float(intervals[logs].mean() * k) if logs.any() else None,
              host_cpu_time_s=(cpu1 - cpu0) / n, input_wait_s=(input1 - input0) / n,
              other_threads_cpu_s={name: (v - threads0.get(name, 0.0)) / n for name, v in threads1.items()},
              log_every=config.train.log_every)


def _threads_cpu() -> dict:
  """CPU seconds of this process's Python threads but the calling one, summed by kind (their name's stem)."""
  seconds = collections.Counter()
  for thread in threading.enumerate():
    if thread is threading.current_thread() or thread.ident is None:
      continue
    try:
      cpu = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (OSError, ProcessLookupError):  # ended meanwhile
      continue
    seconds[thread.name.split("_")[0].rstrip("-0123456789") or thread.name] += cpu
  return dict(seconds)


def main(config, steps, warmup, data_dir, pipeline, pipeline_batches, profile, host_loop):
  import jax  # pylint: disable=g-import-not-at-top
  from electra_jax.data.special_ids import SpecialIds  # pylint: disable=g-import-not-at-top
  from electra_jax.model import modeling  # pylint: disable=g-import-not-at-top
  from electra_jax.pretrain import experiment  # pylint: disable=g-import-not-at-top
  from electra_jax.runtime import startup  # pylint: disable=g-import-not-at-top

  startup.initialize()
  name = config_name()
  if data_dir:
    config.data.data_dir = data_dir
  prepared = None
  if data_dir or pipeline:
    from electra_jax.data import prepared as prepared_lib  # pylint: disable=g-import-not-at-top
    config, prepared = prepared_lib.find(config)  # the model built for the data as it was prepared
  special = prepared.special_ids if prepared else SpecialIds()
  device = jax.devices()[0]
  exp = experiment.create(config, special, word_starts=prepared.word_starts if prepared else None)
  batch_size, seq_len = config.train.batch_size, config.data.seq_len
  result = dict(config=name, device=device.device_kind, platform=device.platform,
                num_devices=len(exp.sharded.mesh.devices.flat), batch=batch_size, seq_len=seq_len,
                dtype=config.model.dtype, remat=config.model.remat, attention_impl=exp.model.config.attention_impl,
                attention_kernel=(modeling.fused_kernel(config.model.dtype) or "xla"
                                  if exp.model.config.attention_impl == "fused" else "einsum"),
                step_flops=exp.step_flops, jax=jax.__version__)

  if host_loop:
    if prepared is None:
      raise ValueError("--host_loop reads the prepared data: give --data_dir (or --pipeline with data.data_dir)")
    result.update(time_host_loop(exp, prepared, steps, warmup))
    threads = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in result["other_threads_cpu_s"].items())
    print(f"{name}: the loop's host work at batch {batch_size} x {seq_len}, {result['steps_per_dispatch']} steps a "
          f"dispatch: {result['host_step_time_s'] * 1e3:.2f} ms a step (median {result['host_step_median_s'] * 1e3:.2f}"
          f", a log dispatch {(result['host_log_dispatch_time_s'] or 0) * 1e3:.1f}, CPU "
          f"{result['host_cpu_time_s'] * 1e3:.2f}, waiting for input {result['input_wait_s'] * 1e3:.2f}); other "
          f"threads' CPU a step: {threads}")
    print(json.dumps(result))
    return
  result.update(time_steps(exp, config, special, prepared, steps, warmup, profile))
  stats = device.memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    result["device_peak_bytes_in_use"] = stats["peak_bytes_in_use"]
  if pipeline:
    result.update(time_pipeline(config, prepared, pipeline_batches))
  print(f"{name}: batch {batch_size} x {seq_len} {config.model.dtype} {result['attention_impl']} attention "
        f"({result['attention_kernel']}) on {result['num_devices']} x {device.device_kind}  init {result['init_s']:.1f}"
        f" s  compile {result['compile_s']:.1f} s  step {result['step_time_s'] * 1e3:.1f} ms  "
        f"{result['tokens_per_sec']:.0f} tok/s  (as the loop drives it: {result['loop_step_time_s'] * 1e3:.1f} ms; on "
        f"device-resident batches: {result['loop_resident_step_time_s'] * 1e3:.1f} ms)  "
        f"{result['tflops_per_device']:.3f} TFLOP/s/device  mfu {result['mfu']}  peak memory "
        f"{result.get('peak_memory_bytes', 0) / 2**20:.0f} MiB  {result['param_arrays']} parameter arrays, "
        f"{result['fusions']} fusions in {result['hlo_instructions']} instructions")
  print(json.dumps(result))


def run():
  cli.run("electra-bench", __doc__, main, define_flags(), required=["config"])


if __name__ == "__main__":
  run()
