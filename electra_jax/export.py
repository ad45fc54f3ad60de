"""electra-export: a pre-training checkpoint as an HF transformers ELECTRA directory.

  electra-export --workdir=runs/demo --output=exports/demo
  electra-export --workdir=runs/demo --output=exports/demo_step1000 --step=1000
  electra-export --workdir=runs/demo --output=exports/demo --overwrite                 # replace an earlier export

writes OUT/ = the discriminator (ElectraForPreTraining / ElectraModel), OUT/generator/ = the generator
(ElectraForMaskedLM), each with model.safetensors, config.json and the tokenizer: tokenizer.json (read by
AutoTokenizer, same ids and token_type_ids as our pipeline) plus our own tokenizer file (sentencepiece.model or
vocab.txt) so that `import_hf` and electra-finetune tokenize with our code. OUT may be local or gs://, and is either
complete or absent: everything is written into a temporary directory and put in place at the end (locally renamed;
on gs://, uploaded with config.json, which readers look for first, last). The workdir may be a live run's: export
deletes nothing there. OUT may not be, contain or lie inside what it reads (the workdir's config.json and
checkpoints/, the tokenizer): refused in one line, --overwrite or not.

Import goes the other way (electra_jax.hf.directory.import_hf): electra-finetune and train.init_from accept an HF
ELECTRA directory, ours or a released google/electra-* model saved locally with its WordPiece vocab.txt.

Literal "[CLS]"/"[SEP]"/"[MASK]"/"[PAD]"/"[UNK]" typed into text stay single special tokens in HF tokenizers; our
SentencePiece pipeline never produces special ids from text. Clean such strings from raw text.
"""

from absl import flags, logging

from electra_jax import cli


def define_flags():
  return [flags.DEFINE_string("workdir", None, "Pre-training workdir to export (config.json + checkpoints/)."),
          flags.DEFINE_string("output", None, "Directory to write (the discriminator; the generator goes in "
                              "OUTPUT/generator)."),
          flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the latest intact one)."),
          flags.DEFINE_bool("overwrite", False, "Replace OUTPUT if it exists.")]


def main(workdir, output, step, overwrite):
  # pylint: disable=g-import-not-at-top  (only now: bad flags are refused without them)
  from electra_jax.run import weights
  from electra_jax.run import workdir as workdir_lib
  workdir_lib.check_writable(output, "--output")  # a directory, or one that can be made: not a file, nor under one
  weights.export_hf(workdir, output, step, overwrite)
  logging.info("Exported %s to %s", workdir, output)


def run():
  cli.run("electra-export", __doc__, main, define_flags(), required=["workdir", "output"])


if __name__ == "__main__":
  run()
