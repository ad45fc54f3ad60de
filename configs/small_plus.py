"""ELECTRA-Small++, the shape of Google's released ELECTRA-Small (google/electra-small-discriminator and its
-generator): configs/small.py with a generator as wide as the discriminator (hidden 256, 4 heads, FFN 1024), where
the paper's Small has 1/4. Continue pre-training the release with its generator (both HF directories saved locally;
their vocab.txt tokenizes the data):

  electra-prepare  --config=configs/small_plus.py --config.train.init_from=electra-small-discriminator \
                   --config.data.text_files='corpus/*.txt' --config.data.data_dir=data/small_plus
  electra-pretrain --config=configs/small_plus.py --config.train.init_from=electra-small-discriminator \
                   --config.train.init_from_generator=electra-small-generator \
                   --config.data.data_dir=data/small_plus --workdir=runs/small_plus

The Base and Large releases have the shapes of configs/base.py and configs/large.py (generators 256 wide: 1/3 and
1/4 of the discriminator, embeddings 768 and 1024).
"""
from configs import small


def get_config():
  c = small.get_config()
  c.model.generator_fraction = 1.0
  return c
