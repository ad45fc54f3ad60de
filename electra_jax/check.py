"""electra-check: check a data_dir end to end before a run (before booking an accelerator, after copying it).

  electra-check --data_dir=data/small
  electra-check --data_dir=gs://BUCKET/data      # fetches every shard into this host's local copy

Reads every shard of every dataset electra-prepare wrote there against what it recorded: one line per dataset found
well, one "electra-check: error: ..." line per problem; exit status 0 only when all is well.
"""
import sys

from absl import flags

from electra_jax import cli

COMMAND = "electra-check"


def define_flags():
  return [flags.DEFINE_string("data_dir", None, "The data_dir to check (electra-prepare's --config.data.data_dir).")]


def main(data_dir):
  from electra_jax.data import check  # pylint: disable=g-import-not-at-top  (only now: bad flags are refused first)
  report = check.check(data_dir)
  for line in report.checked:
    print(line)
  for problem in report.problems:
    sys.stderr.write(f"{COMMAND}: error: {' '.join(problem.split())}\n")
  if report.problems:
    sys.exit(1)
  print(f"{data_dir}: all well")


def run():
  cli.run(COMMAND, __doc__, main, define_flags(), required=["data_dir"])


if __name__ == "__main__":
  run()
