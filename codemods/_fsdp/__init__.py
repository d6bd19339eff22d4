"""The parts of the `fsdp` codemod (codemods/fsdp.py) that ddp has no
counterpart for; everything else it takes from codemods/_ddp.

- checkpoints.py  state dicts of the sharded model: gathered saves, loads
                  from a full dict, and the collectives' conditions
"""
