"""Data: tokenizers, corpora, prepared TFDS datasets, labelled tasks and the input pipeline. May import config and
runtime/; reaches no model and no Flax, so electra-prepare (which builds datasets) runs without them."""
