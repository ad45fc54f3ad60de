"""The train state of pre-training and fine-tuning: sharding.create_state places and jits it alike for both, and
update.py holds the one update of it."""
from typing import Any

import flax
import jax


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any

