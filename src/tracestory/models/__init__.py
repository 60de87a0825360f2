"""Model code shared by the workloads: torch-free configurations and FLOP/byte formulas
(:mod:`.llama_config`), and the torch modules (:mod:`.llama`, which imports torch at its top, so
callers import it where they need it)."""
