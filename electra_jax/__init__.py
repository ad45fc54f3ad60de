"""ELECTRA pre-training in JAX/Flax."""
