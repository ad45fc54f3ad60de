"""Data: tokenizers, corpora, prepared TFDS datasets, labelled tasks and the input pipeline. May import runtime/ only;
electra-prepare (which builds datasets) never loads the model."""
