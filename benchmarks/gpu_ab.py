"""The pre-training step under several settings, in one process: what a GPU sitting's A/B needs within minutes.

  python benchmarks/gpu_ab.py --config=configs/small.py --data_dir=data/small --config.train.batch_size=128 \
      --config.model.attention_impl=fused --config.model.attention_dropout_rate=0 \
      --variant=default --variant=per_array:--config.train.flat_update=False \
      --variant=k4:--config.train.steps_per_dispatch=4

On a fresh GPU machine each electra-bench process spends most of its two minutes starting and compiling; here the
variants (NAME[:OVERRIDE,OVERRIDE...], each on top of the --config.* overrides) share one start-up. Every variant's
train and evaluation steps and checkpoints' checks are compiled first, the first variant alone (its gemms' autotuning
is then cached in this process), the others --compile_threads at a time, into the persistent compilation cache: the
programs electra-pretrain with the same settings loads instead of compiling. Then each variant is timed in turn by
electra-bench's own measurement (electra_jax.bench.time_steps: the bare step, the loop on resident and on placed
batches, the compiled step's kernels by kind; compile_s is the variant's compiling in the first pass), plus the loop
on batches written into the same device buffers every dispatch (input_pipeline.OnDevice(stable=True):
loop_stable_step_time_s), which spares a GPU step's command buffer the update for moved inputs.

The last line of output is one JSON object: {"runs": [{"variant", "overrides", "result"}, ...], "warm_s", ...}, each
result holding what electra-bench's JSON holds for the same step.
"""
import concurrent.futures
import json
import time

from absl import flags
from ml_collections import config_flags

from electra_jax import bench, cli


def define_flags():
  return [
      config_flags.DEFINE_config_file("config", None, "Pre-training config file (Python, get_config()).",
                                      lock_config=True),
      flags.DEFINE_string("data_dir", None, "The prepared data the steps read (the training stream's batches)."),
      flags.DEFINE_multi_string("variant", [], "NAME[:--config.KEY=VALUE,...]: a setting to time (repeatable), in "
                                "this order; the first is the base the others are compiled after."),
      flags.DEFINE_integer("steps", 50, "Timed dispatches per variant and window."),
      flags.DEFINE_integer("warmup", 3, "Untimed dispatches after compiling."),
      flags.DEFINE_integer("compile_threads", 4, "Variants compiled at once after the first.")]


def parse_variant(spec: str) -> tuple[str, list[str]]:
  """"NAME:--config.a=1,--config.b=x" -> ("NAME", ["--config.a=1", "--config.b=x"])."""
  name, _, overrides = spec.partition(":")
  overrides = [o for o in overrides.split(",") if o]
  bad = [o for o in overrides if not o.startswith("--config.") or "=" not in o]
  if not name or bad:
    raise ValueError(f"--variant={spec}: expected NAME[:--config.KEY=VALUE,...]")
  return name, overrides


def apply(config, overrides: list[str]):
  """A copy of `config` with each --config.KEY=VALUE set, the value read as the key's type."""
  config = config.copy_and_resolve_references()
  for override in overrides:
    key, _, value = override.removeprefix("--config.").partition("=")
    *path, leaf = key.split(".")
    node = config
    for part in path:
      node = node[part]
    if leaf not in node:
      raise ValueError(f"{override}: unknown config key {key}")
    old = node[leaf]
    node[leaf] = (value.lower() in ("true", "1") if isinstance(old, bool) else
                  value if old is None else type(old)(value))
  return config


def warm(exp) -> float:
  """Seconds to compile exp's train and evaluation steps and checkpoints' checks as electra-pretrain compiles them at
  start: the same programs, so that its compilation cache holds them."""
  import jax  # pylint: disable=g-import-not-at-top
  from electra_jax.pretrain import experiment  # pylint: disable=g-import-not-at-top
  from electra_jax.run import loop  # pylint: disable=g-import-not-at-top
  t0 = time.perf_counter()
  (_, step, (state, batch, _)), _ = experiment.compile_targets(exp)
  # The loop's key is made on the host, uncommitted; a replicated one lowers to another program.
  step.lower(state, batch, jax.random.key(exp.config.train.seed)).compile()
  loop.compile_ahead(lambda: experiment.compile_targets(exp), "eval step").result()
  return time.perf_counter() - t0


def time_stable(exp, prepared, steps: int) -> float:
  """Seconds a step of the loop window of bench.time_steps on the training stream, its batches written into the same
  device buffers every dispatch."""
  import jax  # pylint: disable=g-import-not-at-top
  from electra_jax.data import input_pipeline  # pylint: disable=g-import-not-at-top
  config, k = exp.config, exp.steps_per_dispatch
  rng = jax.random.key(config.train.seed)
  state = exp.sharded.init(rng)
  placed = input_pipeline.OnDevice(input_pipeline.train_iterator(config, prepared), exp.step_batch, steps=k,
                                   stable=True)
  state, _ = jax.block_until_ready(exp.step(state, next(placed), rng))
  _, seconds = bench.loop_window(exp.step, state, placed, rng, steps)
  placed.close()
  return seconds / (steps * k)


def main(config, data_dir, variant, steps, warmup, compile_threads):
  import jax  # pylint: disable=g-import-not-at-top
  from electra_jax.data import prepared as prepared_lib  # pylint: disable=g-import-not-at-top
  from electra_jax.pretrain import experiment  # pylint: disable=g-import-not-at-top
  from electra_jax.runtime import startup  # pylint: disable=g-import-not-at-top
  variants = [parse_variant(v) for v in variant or ["default"]]
  if len({name for name, _ in variants}) < len(variants):
    raise ValueError(f"--variant names repeat: {', '.join(name for name, _ in variants)}")
  if not data_dir:
    raise ValueError("--data_dir is required: the steps read the prepared data, as pre-training does")
  startup.initialize()
  config.data.data_dir = data_dir
  config, prepared = prepared_lib.find(config)
  exps = [experiment.create(apply(config, overrides), prepared.special_ids, word_starts=prepared.word_starts)
          for _, overrides in variants]
  t0 = time.perf_counter()
  compile_s = [warm(exps[0])]
  with concurrent.futures.ThreadPoolExecutor(compile_threads) as pool:
    compile_s += pool.map(warm, exps[1:])
  warm_s = time.perf_counter() - t0
  print(f"gpu_ab: {len(exps)} variants compiled in {warm_s:.0f} s", flush=True)
  device = jax.devices()[0]
  runs = []
  for (name, overrides), exp, seconds in zip(variants, exps, compile_s):
    c = exp.config
    result = dict(config=bench.config_name(), device=device.device_kind, platform=device.platform,
                  num_devices=len(exp.sharded.mesh.devices.flat), batch=c.train.batch_size, seq_len=c.data.seq_len,
                  dtype=c.model.dtype, attention_impl=exp.model.config.attention_impl,
                  flat_update=c.train.flat_update, step_flops=exp.step_flops, jax=jax.__version__)
    result.update(bench.time_steps(exp, c, prepared.special_ids, prepared, steps, warmup), compile_s=seconds)
    result["loop_stable_step_time_s"] = time_stable(exp, prepared, steps)
    runs.append(dict(variant=name, overrides=overrides, result=result))
    print(f"gpu_ab: {name}: step {result['step_time_s'] * 1e3:.2f} ms, as the loop drives it "
          f"{result['loop_step_time_s'] * 1e3:.2f} ms (stable buffers {result['loop_stable_step_time_s'] * 1e3:.2f}, "
          f"resident batches {result['loop_resident_step_time_s'] * 1e3:.2f}), {result['kernels']:,} kernels a "
          f"dispatch of {result['steps_per_dispatch']}, compile {result['compile_s']:.1f} s", flush=True)
  print(json.dumps(dict(runs=runs, warm_s=warm_s, compile_threads=compile_threads)))


if __name__ == "__main__":
  cli.run("gpu_ab", __doc__, main, define_flags(), required=["config"])
