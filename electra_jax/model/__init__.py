"""The method: ELECTRA's generator and discriminator (modeling), masking, sampling replacements, the losses, the
objectives (ELECTRA, MLM, two-stage) and their FLOPs. Pure functions of arrays; may import data/ (special ids), config
and runtime/, nothing of the run, the mesh or the commands."""
