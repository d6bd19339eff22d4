"""The parts of the `ddp` codemod (codemods/ddp.py), one kind of rewrite a
module: each is a mixin of `DistributedDataParallelCodemod` that plans its
rewrites into the codemod's plan (`_step`, `_edits`, `_before`, `_after`,
`_guarded`, `_remove`), reading the facts of the script from the shared model.

- queries.py  names, variables and their references, through the model
- wrap.py     DataParallel replaced by DistributedDataParallel (or dropped)
- bare_models.py  the models the optimizers train, wrapped where no DataParallel is
- references.py   uses of a wrapped model that read the unwrapped one (`unwrap_model`)
- loaders.py  DistributedSampler, set_epoch, per-process learning rates
- output.py   printing, logging and file writes on rank 0; barriers before reads
- decisions.py  loop exits decided by rank 0 for every rank (`rank_zero_decides`)
- entry.py    where the process group is joined; --local_rank
- common.py   the runtime module, the plan's data types, helpers on syntax alone
"""
