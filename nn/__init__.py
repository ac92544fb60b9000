"""nn: layers, the GPT and optimizers, built on tinygrad_attn's public API only.

(Filled in by the nn issue; the engine does not depend on it.)
"""
