"""Checkpoints in the safetensors format: nn.save / nn.load / nn.load_metadata.

The format itself (reading, writing, atomic saves, dtypes, every check on a bad file) is the
engine's, in tinygrad_attn/serialization; these names keep nn's flat API over it:

- `save(state_dict, path, metadata=None)` writes name -> Tensor, with a dict of strings in
  the header's metadata, atomically (a crash mid-save leaves the old file whole).
- `load(path, device="cpu")` reads any safetensors file into {name: Tensor}; a bad file is
  a ValueError naming it.
- `load_metadata(path)` reads the header's strings only.
- `flatten_state` / `unflatten_state` turn a nested state (an optimizer's state_dict, a
  sampler's state) into named tensors plus a JSON layout for the metadata.

`ta.save` / `ta.load` write and read whole nested checkpoints (model and optimizer state
dicts, numbers, the config) as one such file; see docs/checkpoints.md.
"""

from __future__ import annotations

from tinygrad_attn.serialization import (  # noqa: F401
    flatten_state,
    load_metadata,
    unflatten_state,
)
from tinygrad_attn.serialization import load_file as load  # noqa: F401
from tinygrad_attn.serialization import save_file as save  # noqa: F401
