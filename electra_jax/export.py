"""electra-export: a pre-training checkpoint as an HF transformers ELECTRA directory.

  electra-export --workdir=runs/demo --output=exports/demo
  electra-export --workdir=runs/demo --output=exports/demo_step1000 --step=1000
  electra-export --workdir=runs/demo --output=exports/demo --overwrite                 # replace an earlier export

Writes OUT/ (the discriminator: ElectraForPreTraining) and OUT/generator/ (ElectraForMaskedLM), each with
model.safetensors, config.json and the tokenizer (tokenizer.json too, same ids). OUT, local or gs://, is complete or
absent, apart from what it reads; the workdir may be a live run's. electra-finetune and train.init_from read such a
directory back, ours or a released google/electra-* one (docs/api.md).
"""
from absl import flags, logging

from electra_jax import cli


def define_flags():
  return [flags.DEFINE_string("workdir", None, "Pre-training workdir to export (config.json + checkpoints/)."),
          flags.DEFINE_string("output", None, "Directory to write (the generator goes in OUTPUT/generator)."),
          flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the latest intact one)."),
          flags.DEFINE_bool("overwrite", False, "Replace OUTPUT if it exists.")]


def main(workdir, output, step, overwrite):
  # pylint: disable=g-import-not-at-top  (only now: bad flags are refused without them)
  from electra_jax.run import weights
  from electra_jax.run import workdir as workdir_lib
  workdir_lib.check_writable(output, "--output")
  weights.export_hf(workdir, output, step, overwrite)
  logging.info("Exported %s to %s", workdir, output)


def run():
  cli.run("electra-export", __doc__, main, define_flags(), required=["workdir", "output"])


if __name__ == "__main__":
  run()
