r"""`make replicate`: ELECTRA's central result (Clark et al. 2020: Table 5, and Two-stage from Fig. 3) in miniature.

  python -m studies.replicate [--config=configs/studies/replicate.py[:cpu|gpu|tiny]] [--workdir=runs/replicate] \
      [--output=docs/replication.md] [--config.objectives=electra,mlm] [--config.budget_steps=N] [--plan_only] ...

Run it from the repository root (or with that on PYTHONPATH): configs/ and studies/ import as packages.

Every objective of the study (configs/studies/replicate.py) pre-trains the same discriminator on the same data for the
same FLOPs: the budget is budget_steps steps of objective electra, each objective's step costs what
electra_jax.model.flops.step_flops says (its generator included), so it gets round(budget / step FLOPs) steps, and its
warm-up is a fixed fraction of them. Its checkpoints along the way and at the end are fine-tuned on the demo tasks with
several seeds, beside studies/finetune_demo.py's floors (random init of the same architecture; TF-IDF + logistic
regression). Writes <workdir>/results.json, the Markdown report (--output) and its figures in the directory named like
the report without .md.

Resumable: a pre-training run already at its last step is skipped (an unfinished one resumes from its checkpoint), and
a fine-tuning run whose workdir holds eval_results.json with the same config is reused; so running the same command
again continues an interrupted study, and on a finished one only rewrites the report.

Modules: plan (the equal-FLOPs plan), run (the runs, progress and ETA), report (the Markdown), plot (the figures);
this one is the command line.
"""
import json
import os
import pathlib
import shlex
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from studies import finetune_demo
from studies.replicate import plan, plot, report, run
from electra_jax import prepare
from electra_jax.runtime import startup

ROOT = pathlib.Path(__file__).resolve().parents[2]

_CONFIG = config_flags.DEFINE_config_file("config", str(ROOT / "configs" / "studies" / "replicate.py"),
                                          "The study: configs/studies/replicate.py[:cpu|gpu|tiny].", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "", "Where every run and results.json go ('' = the config's workdir).")
_OUTPUT = flags.DEFINE_string("output", "", "The Markdown report ('' = the config's output); its figures go to the "
                              "directory of the same name without .md.")
_PLAN_ONLY = flags.DEFINE_bool("plan_only", False, "Print each objective's steps and FLOPs, then exit.")


def main(argv):
  from electra_jax.runtime import console  # pylint: disable=g-import-not-at-top
  console.start()
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # the progress lines, not every library's INFO
  startup.initialize()
  study = _CONFIG.value
  workdir, output = _WORKDIR.value or study.workdir, _OUTPUT.value or study.output
  try:
    budget, configs, flops = plan.plan(study)
    plan.print_plan(study, budget, configs, flops)
    if _PLAN_ONLY.value:
      return
    # The fine-tuning runs of a task all compile the same programs (a resumed pre-training its own): compile once,
    # into the compilation cache already set (JAX_COMPILATION_CACHE_DIR: one shared across runs and studies), else
    # the workdir's.
    if not jax.config.jax_compilation_cache_dir:
      jax.config.update("jax_compilation_cache_dir", os.path.join(os.path.abspath(workdir), "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    prepare.build(study.pretrain)  # a no-op when prepared (cpu: by `make demo` too)
    results = run.run_study(study, workdir, budget, configs, flops)
  except (ValueError, OSError) as e:  # bad input, e.g. a workdir holding another study's run: one line
    raise SystemExit(f"error: {e}") from None
  results["machine"] = finetune_demo.machine()
  with open(os.path.join(workdir, "results.json"), "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  figures = plot.plot(results, os.path.splitext(output)[0])
  figures = {k: os.path.relpath(v, os.path.dirname(os.path.abspath(output))) for k, v in figures.items()}
  command = " ".join(["python -m studies.replicate"] + [shlex.quote(a) for a in sys.argv[1:]])
  text = report.report(results, study, command, results["machine"], figures)
  pathlib.Path(output).write_text(text, encoding="utf-8")
  print(text, flush=True)
  print(f"Wrote {output}, its figures under {os.path.splitext(output)[0]}/ and {workdir}/results.json", flush=True)


if __name__ == "__main__":
  app.run(main)
