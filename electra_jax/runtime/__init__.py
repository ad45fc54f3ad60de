"""The process and its surroundings, below everything else: files local and on gs:// (storage), Cloud Storage outages,
JAX's set-up (startup), the watchdog of a multi-process run (peers), optional packages and what the console prints;
the private names of jax and gcsfs it needs, behind one adapter each. Imports nothing else of electra_jax."""
