"""What the registry knows of each codemod without importing it (nor LibCST):
its word, finding codes and titles, notes, summary, the words it requires
or excludes,
its text triggers, and where its class lives. `check`, `apply`, `list` and
the config read this; a codemod's class is imported only when a file
reaches LibCST.

The table below is generated from the classes. After changing a codemod's
word, codes, notes, summary, requires, excludes or triggers (or adding a codemod),
regenerate it:

    python -m accelmigrate.codemods._manifest

tests/test_startup_imports.py fails, naming that command, when it differs
from the classes.
"""

from __future__ import annotations

import pprint
import sys
from pathlib import Path

# --- generated: do not edit below by hand -----------------------------------
CODEMODS: dict = {'modernize': {'module': 'modernize',
               'name': 'Modernize',
               'summary': 'rewrite pre-0.4 idioms that fail today: loss.data[0], Variable(...), '
                          'volatile=True, size_average',
               'requires': (),
               'excludes': (),
               'triggers': ('Variable',
                            '.data',
                            'volatile',
                            'size_average',
                            'reduce',
                            'uniform',
                            'normal',
                            'constant',
                            'eye',
                            'dirac',
                            'orthogonal',
                            'sparse',
                            'retain_variables',
                            'apex'),
               'codes': {'AM220': 'x.data[0] on a one-number tensor (an IndexError since PyTorch 0.4): '
                                  'x.item()',
                         'AM221': 'torch.autograd.Variable: the tensor itself, .detach(), or torch.Tensor in '
                                  'type checks',
                         'AM222': 'Variable(..., volatile=True) (no effect since PyTorch 0.4): a '
                                  'torch.no_grad() region',
                         'AM223': 'a running total of loss.data read as total[0]: accumulate loss.item()',
                         'AM224': 'size_average= / reduce= of a loss: reduction=',
                         'AM225': 'nn.init initialiser without the trailing underscore: the underscore form',
                         'AM226': 'backward(retain_variables=...) (a TypeError since PyTorch 0.4): '
                                  'retain_graph=',
                         'AM227': 'NVIDIA apex amp, gone from current apex: `--to amp` moves it onto '
                                  'torch.amp'},
               'notes': (),
               'reads_handoffs': False,
               'needs_torch': (0, 4),
               'handed_to': {'AM227': ('amp', 'accelerate', 'fabric')}},
 'main-guard': {'module': 'main_guard',
                'name': 'MainGuard',
                'summary': 'flat scripts: the code that runs at import goes under `if __name__ == '
                           '"__main__":` (spawned workers re-import the file)',
                'requires': (),
                'excludes': (),
                'triggers': ('DataLoader', 'backward', 'spawn', 'Process', 'Pool', 'start_processes'),
                'codes': {'AM120': 'code that runs at import, outside an `if __name__ == "__main__":` guard',
                          'AM121': 'a definition reads, while the file is imported, a name that only the '
                                   "script's code sets",
                          'AM122': 'code that DataLoader workers run reads a module variable that only the '
                                   "script's code sets",
                          'AM123': 'code outside the `if __name__ == "__main__":` block starts processes or '
                                   'goes through a loader'},
                'notes': (),
                'reads_handoffs': False,
                'needs_torch': (0, 0)},
 'workers': {'module': 'workers',
             'name': 'Workers',
             'summary': "DataLoader: worker processes sized to this process's cores, pinned memory",
             'requires': ('main-guard',),
             'excludes': (),
             'triggers': ('DataLoader',),
             'codes': {'AM101': 'DataLoader without worker processes or pinned memory',
                       'AM102': 'DataLoader with *args or **kwargs whose worker settings cannot be seen',
                       'AM103': 'IterableDataset that does not split its stream among workers',
                       'AM104': 'DataLoader built while the script runs, without an `if __name__ == '
                                '"__main__":` guard',
                       'AM105': 'collate_fn or worker_init_fn that worker processes cannot receive (lambda, '
                                'local function)',
                       'AM106': 'dataset changed after its DataLoader is built',
                       'AM107': 'dataset of in-memory tensors: left without workers',
                       'AM108': 'dataset class that puts its tensors on the GPU, which worker processes '
                                'cannot do'},
             'notes': ('AM107',),
             'reads_handoffs': False,
             'needs_torch': (1, 7)},
 'item': {'module': 'item',
          'name': 'Item',
          'summary': 'store loss.item() / loss.detach(), not the loss and its graph, across iterations',
          'requires': (),
          'excludes': (),
          'triggers': ('backward',),
          'codes': {'AM201': 'loss kept across iterations with its autograd graph, later read only as a '
                             'number: store .item()',
                    'AM202': 'loss kept across iterations with its autograd graph, later used as a tensor: '
                             'store .detach()',
                    'AM203': 'loss kept across iterations with its autograd graph, whose later use cannot be '
                             'followed: detach it by hand'},
          'notes': (),
          'reads_handoffs': False,
          'needs_torch': (0, 4)},
 'empty-cache': {'module': 'empty_cache',
                 'name': 'EmptyCache',
                 'summary': 'remove torch.cuda.empty_cache() from loop bodies (a device sync every '
                            'iteration)',
                 'requires': (),
                 'excludes': (),
                 'triggers': ('empty_cache',),
                 'codes': {'AM210': 'torch.cuda.empty_cache() in a loop body synchronises the device every '
                                    'iteration',
                           'AM211': 'torch.cuda.empty_cache() outside a loop: one device sync, kept',
                           'AM212': 'torch.cuda.empty_cache() in a loop body, inside a larger statement: '
                                    'remove it by hand'},
                 'notes': ('AM211',),
                 'reads_handoffs': False,
                 'needs_torch': (0, 0)},
 'device': {'module': 'device',
            'name': 'Device',
            'summary': "hard-coded .cuda() / 'cuda' placements -> one device chosen at run time "
                       '(get_device())',
            'requires': (),
            'excludes': (),
            'triggers': ('cuda', 'load', 'nccl', 'apex'),
            'codes': {'AM301': '.cuda() ties the script to a CUDA GPU',
                      'AM302': "hard-coded CUDA device ('cuda', torch.device('cuda'), a GPU ordinal)",
                      'AM303': 'CUDA device definition that bypasses the run-time device choice',
                      'AM304': 'torch.load without map_location: a checkpoint saved on a GPU fails to load '
                               'on a CPU',
                      'AM305': 'redundant second device move',
                      'AM306': '.cpu().cuda(): a round trip through the host',
                      'AM307': 'torch.cuda.set_device(...) that fails without CUDA',
                      'AM308': 'legacy CUDA tensor type (torch.cuda.FloatTensor...)',
                      'AM309': 'CUDA availability check around device moves that .to(device) makes unneeded',
                      'AM310': 'explicit GPU other than 0',
                      'AM311': 'CUDA placement with no device name in reach',
                      'AM312': 'call that needs a GPU to run, outside a CUDA check',
                      'AM313': 'GPU index computed at run time (a rank, a loop variable, a passed-in device)',
                      'AM314': 'process-group backend hard-coded to NCCL, which needs a GPU',
                      'AM315': 'NVIDIA apex required at import',
                      'AM316': 'DistributedDataParallel given GPU device_ids, which a model on the CPU '
                               'refuses'},
            'notes': (),
            'reads_handoffs': False,
            'needs_torch': (1, 12)},
 'channels-last': {'module': 'channels_last',
                   'name': 'ChannelsLast',
                   'summary': 'conv nets: the model and its 4-D training inputs channels-last (on CUDA)',
                   'requires': (),
                   'excludes': (),
                   'triggers': ('backward',),
                   'codes': {'AM730': 'conv net trained in the channels-first memory format',
                             'AM731': 'conv net whose model or inputs cannot be converted here: convert them '
                                      'by hand'},
                   'notes': (),
                   'reads_handoffs': False,
                   'needs_torch': (1, 12)},
 'amp': {'module': 'amp',
         'name': 'Amp',
         'summary': 'mixed precision: torch.autocast around forward and loss, a GradScaler for fp16; apex '
                    'and torch.cuda.amp migrated',
         'requires': ('device',),
         'excludes': (),
         'triggers': ('backward',
                      'no_grad',
                      'inference_mode',
                      '.amp',
                      'apex',
                      'autocast',
                      'GradScaler',
                      'custom_fwd',
                      'custom_bwd',
                      'masked_fill'),
         'codes': {'AM401': 'training step in full precision: no torch.autocast around its forward, no '
                            'GradScaler',
                   'AM402': 'evaluation under no_grad without torch.autocast',
                   'AM403': 'NVIDIA apex amp, which torch.amp replaces',
                   'AM404': 'deprecated torch.cuda.amp / torch.cpu.amp API',
                   'AM405': "checkpoint that needs the GradScaler's state next to the optimizer's",
                   'AM406': 'gradients clipped or read, which need scaler.unscale_() first',
                   'AM407': 'values computed under autocast that reach numpy or an image writer, which have '
                            'no bfloat16',
                   'AM408': 'training step in mixed precision already (its own torch.autocast or '
                            'GradScaler): left as it is',
                   'AM410': 'backward whose forward, loss or step is out of view: add autocast and a '
                            'GradScaler by hand',
                   'AM411': 'optimizer.step(closure): add autocast and a GradScaler by hand',
                   'AM412': 'backward with a gradient, inputs= or create_graph=, or raw autograd calls: '
                            'scale the loss by hand',
                   'AM413': 'no device in reach: autocast needs the device type',
                   'AM414': 'optimizer not traceable to its constructor: bind the GradScaler by hand',
                   'AM415': 'training step laid out in a way the codemod cannot rewrite safely: migrate it '
                            'by hand',
                   'AM416': 'apex usage without a native equivalent: apex left in place',
                   'AM417': 'checkpoint that saves the optimizer but not the GradScaler',
                   'AM418': 'loss that torch refuses under autocast (binary cross-entropy on probabilities)',
                   'AM419': 'fill constant that float16 cannot hold (`masked_fill(mask, -1e9)`)'},
         'notes': ('AM405', 'AM406', 'AM407', 'AM408'),
         'reads_handoffs': False,
         'needs_torch': (1, 12)},
 'ddp': {'module': 'ddp',
         'name': 'DistributedDataParallelCodemod',
         'summary': 'DataParallel or one process -> DistributedDataParallel, DistributedSampler, rank-0 '
                    'output',
         'requires': ('device', 'main-guard'),
         'excludes': (),
         'triggers': ('DataParallel', 'DataLoader', 'optim', 'local_rank', 'local-rank', 'backward'),
         'codes': {'AM501': "script that never joins the launch's process group",
                   'AM502': 'DataParallel: one process drives every GPU',
                   'AM503': 'trained model not wrapped in DistributedDataParallel',
                   'AM504': 'training DataLoader without a DistributedSampler',
                   'AM505': 'epoch loop without `sampler.set_epoch(epoch)`',
                   'AM506': 'printing, logging or file writes on every rank',
                   'AM507': 'tqdm bar shown on every rank',
                   'AM508': 'use of the model that needs the bare module (state_dict, its own methods and '
                            'attributes, tracing)',
                   'AM509': '--local_rank flag that torchrun no longer passes',
                   'AM510': 'learning rate not scaled for the per-process batch',
                   'AM511': "loop exit decided on each rank's own value",
                   'AM512': 'backward through a graph already backpropagated (`retain_graph=True`)',
                   'AM513': 'DataParallel around a model that only runs inference',
                   'AM514': "running total of a training loop read after it: one rank's share of the "
                            'one-process total',
                   'AM520': 'model that cannot be wrapped safely',
                   'AM521': 'training loop, epoch loop or training DataLoader not found',
                   'AM522': 'DataLoader with a custom sampler',
                   'AM523': 'DataLoader whose batch size or arguments cannot be seen',
                   'AM524': 'evaluation DataLoader: every rank evaluates the full set',
                   'AM525': 'output that cannot be moved to rank 0 safely',
                   'AM526': 'script already distributed',
                   'AM527': 'model used through its own methods while training',
                   'AM528': "file read that may race rank 0's write, or a writer every rank creates",
                   'AM529': 'learning rate that cannot be scaled',
                   'AM530': 'name needed by the migrated code already used',
                   'AM531': 'no entry point in this file to join the process group from',
                   'AM532': "random draw sized by the batch, alike on every rank (a GAN's noise)",
                   'AM533': "global batch size shaping this process's share of the batch",
                   'AM534': 'batch size that the processes cannot split evenly',
                   'AM537': 'folder created on every rank at once',
                   'AM538': "BatchNorm statistics computed on each process's share of the batch (see "
                            'sync-bn)',
                   'AM535': 'random draws (dropout, noise) made by each process for its share of the batch',
                   'AM536': 'data set or last batch that the processes share out unevenly',
                   'AM539': "batch drawn without a DataLoader (by index, whole tensors, a function's "
                            'results), alike on every rank'},
         'notes': ('AM524', 'AM526', 'AM535', 'AM536', 'AM538'),
         'reads_handoffs': True,
         'needs_torch': (1, 12)},
 'sync-bn': {'module': 'sync_bn',
             'name': 'SyncBatchNorm',
             'summary': 'BatchNorm -> SyncBatchNorm before DistributedDataParallel wraps the model',
             'requires': ('ddp',),
             'excludes': (),
             'triggers': ('DataParallel', 'DataLoader', 'optim'),
             'codes': {'AM540': 'BatchNorm layers that compute batch statistics per process under DDP '
                                '(SyncBatchNorm shares them)',
                       'AM541': 'no DistributedDataParallel wrap found to convert before',
                       'AM542': "the wrap's process group cannot be passed to the conversion",
                       'AM543': 'no name for torch.nn.SyncBatchNorm where the conversion goes',
                       'AM544': 'model without BatchNorm layers: nothing to convert'},
             'notes': ('AM544',),
             'reads_handoffs': False,
             'needs_torch': (1, 12)},
 'fsdp': {'module': 'fsdp',
          'name': 'FullyShardedCodemod',
          'summary': 'one process -> FSDP2: the model sharded across processes, DistributedSampler, rank-0 '
                     'output, gathered checkpoints',
          'requires': ('device', 'main-guard'),
          'excludes': ('ddp',),
          'triggers': ('DataParallel', 'DataLoader', 'optim', 'local_rank', 'local-rank', 'backward'),
          'codes': {'AM501': "script that never joins the launch's process group",
                    'AM502': 'DataParallel: one process drives every GPU',
                    'AM504': 'training DataLoader without a DistributedSampler',
                    'AM505': 'epoch loop without `sampler.set_epoch(epoch)`',
                    'AM506': 'printing, logging or file writes on every rank',
                    'AM507': 'tqdm bar shown on every rank',
                    'AM508': 'use of the model that needs the bare module (state_dict, its own methods and '
                             'attributes, tracing)',
                    'AM509': '--local_rank flag that torchrun no longer passes',
                    'AM510': 'learning rate not scaled for the per-process batch',
                    'AM511': "loop exit decided on each rank's own value",
                    'AM512': 'backward through a graph already backpropagated (`retain_graph=True`)',
                    'AM513': 'DataParallel around a model that only runs inference',
                    'AM514': "running total of a training loop read after it: one rank's share of the "
                             'one-process total',
                    'AM520': 'model that cannot be wrapped safely',
                    'AM521': 'training loop, epoch loop or training DataLoader not found',
                    'AM522': 'DataLoader with a custom sampler',
                    'AM523': 'DataLoader whose batch size or arguments cannot be seen',
                    'AM524': 'evaluation DataLoader: every rank evaluates the full set',
                    'AM525': 'output that cannot be moved to rank 0 safely',
                    'AM526': 'script already distributed',
                    'AM527': 'model used through its own methods while training',
                    'AM528': "file read that may race rank 0's write, or a writer every rank creates",
                    'AM529': 'learning rate that cannot be scaled',
                    'AM530': 'name needed by the migrated code already used',
                    'AM531': 'no entry point in this file to join the process group from',
                    'AM532': "random draw sized by the batch, alike on every rank (a GAN's noise)",
                    'AM533': "global batch size shaping this process's share of the batch",
                    'AM534': 'batch size that the processes cannot split evenly',
                    'AM537': 'folder created on every rank at once',
                    'AM538': "BatchNorm statistics computed on each process's share of the batch (see "
                             'sync-bn)',
                    'AM535': 'random draws (dropout, noise) made by each process for its share of the batch',
                    'AM536': 'data set or last batch that the processes share out unevenly',
                    'AM539': "batch drawn without a DataLoader (by index, whole tensors, a function's "
                             'results), alike on every rank',
                    'AM760': 'trained model not sharded across the processes (FSDP2 `fully_shard`)',
                    'AM761': 'optimizer built before the model is sharded',
                    'AM762': 'state dict or module of the model used where its shards cannot be gathered',
                    'AM763': 'model state dict saved without gathering its shards',
                    'AM764': 'model state dict loaded without spreading it over the shards',
                    'AM765': "optimizer state dict saved or loaded as one rank's shard",
                    'AM766': 'several trained models: fsdp shards one',
                    'AM767': 'script wrapped in DistributedDataParallel: fsdp and ddp exclude each other',
                    'AM768': 'model used outside forward (own methods, tracing) where its parameters are '
                             'sharded',
                    'AM769': 'save or load of the model under a condition each rank decides for itself'},
          'notes': ('AM524', 'AM526', 'AM535', 'AM536', 'AM538'),
          'reads_handoffs': False,
          'needs_torch': (2, 6)},
 'accelerate': {'module': 'accelerate',
                'name': 'AccelerateCodemod',
                'summary': 'a plain or DataParallel script -> Hugging Face Accelerate (prepare, backward, '
                           'main-process output)',
                'requires': (),
                'excludes': ('workers', 'device', 'amp', 'ddp', 'fsdp', 'fabric'),
                'triggers': ('backward',),
                'codes': {'AM801': 'script without an Accelerator',
                          'AM802': 'model, optimizer and training DataLoader not prepared by Accelerate',
                          'AM803': 'device chosen by the script, not by Accelerate',
                          'AM804': 'backward outside accelerator.backward',
                          'AM805': 'gradient clipping outside accelerator.clip_grad_norm_',
                          'AM806': 'DataParallel: one process drives every GPU',
                          'AM807': 'printing on every process',
                          'AM808': 'checkpoint or file written on every process',
                          'AM809': 'use of the model that needs the bare module (state_dict, its own '
                                   'attributes)',
                          'AM810': 'shuffled training DataLoader: the main process draws the order and sends '
                                   'each process its slice',
                          'AM811': "last partial batch completed with the epoch's first samples on N "
                                   'processes',
                          'AM812': 'mixed precision (torch autocast, GradScaler, apex amp) moved onto '
                                   'Accelerator(mixed_precision=...)',
                          'AM813': 'evaluation DataLoader sharded; metrics from '
                                   'accelerator.gather_for_metrics',
                          'AM815': 'random draw sized by the batch in a loop that trains, alike on every '
                                   "process (a GAN's noise)",
                          'AM816': "random numbers that on N processes are not the original's (dropout "
                                   'masks, noise behind a shuffled loader)',
                          'AM817': "BatchNorm statistics computed on each process's slice of the batch",
                          'AM820': 'training loop, entry point or trained objects that cannot be prepared',
                          'AM821': 'mixed precision that accelerate does not migrate',
                          'AM822': 'script already distributed or on Accelerate',
                          'AM823': 'loss whose reduction over the batch cannot be read',
                          'AM824': "model used through its own attributes where DDP's wrapper hides them",
                          'AM825': 'name needed by the migrated code already used',
                          'AM826': 'output that cannot be moved to the main process safely',
                          'AM827': 'device placement that cannot be given to Accelerate',
                          'AM828': 'backward that accelerator.backward cannot take as written',
                          'AM829': 'training DataLoader that the processes cannot split',
                          'AM830': "loop exit decided on each process's own value",
                          'AM831': "random draw in a loop that trains, alike on every process (a GAN's "
                                   'noise)',
                          'AM832': "global batch size shaping this process's share of the batch",
                          'AM833': "running total of a training loop read after it: one process's share of "
                                   'the one-process total',
                          'AM834': "Accelerate's defaults: on N processes the global batch is N times the "
                                   "DataLoader's (accelerate=parity keeps the original's)",
                          'AM835': "shuffled training DataLoader: on N processes Accelerate's sampler draws "
                                   "another order (accelerate=parity keeps the original's)",
                          'AM836': 'learning-rate scheduler stepped per epoch, left out of prepare '
                                   "(Accelerate's would step it once per process)"},
                'notes': ('AM811', 'AM816', 'AM817', 'AM822', 'AM834', 'AM835', 'AM836'),
                'reads_handoffs': True,
                'needs_torch': (1, 12)},
 'fabric': {'module': 'fabric',
            'name': 'FabricCodemod',
            'summary': 'a plain or DataParallel script -> Lightning Fabric (setup, setup_dataloaders, '
                       'backward, rank-zero output)',
            'requires': (),
            'excludes': ('workers', 'device', 'amp', 'ddp', 'fsdp', 'accelerate'),
            'triggers': ('backward',),
            'codes': {'AM901': 'script without a Fabric object',
                      'AM902': 'model, optimizer and training DataLoader not set up by Fabric',
                      'AM903': 'device chosen by the script, not by Fabric',
                      'AM904': 'backward outside fabric.backward',
                      'AM905': 'gradient clipping outside fabric.clip_gradients',
                      'AM906': 'DataParallel: one process drives every GPU',
                      'AM907': 'printing on every process',
                      'AM908': 'checkpoint or file written on every process',
                      'AM909': "DataParallel's `.module`, which the model Fabric sets up answers itself",
                      'AM910': "shuffled training DataLoader: on N processes Fabric's DistributedSampler "
                               'draws another order',
                      'AM911': 'data set or last batch that the processes share out unevenly',
                      'AM912': 'mixed precision moved onto Fabric(precision=...)',
                      'AM913': 'training batch size divided among the processes (the global batch kept)',
                      'AM914': 'batch size that the processes cannot split evenly',
                      'AM915': 'random draw sized by the batch in a loop that trains, alike on every process '
                               "(a GAN's noise)",
                      'AM916': "random numbers that on N processes are not the original's (dropout masks)",
                      'AM917': "BatchNorm statistics computed on each process's share of the batch",
                      'AM920': 'training loop, entry point or trained objects that cannot be set up',
                      'AM921': 'mixed precision that fabric does not migrate',
                      'AM922': 'script already distributed, on Accelerate or on Lightning',
                      'AM923': 'loss whose reduction over the batch cannot be read',
                      'AM924': "model trained through its own methods, which skip DDP's synchronisation",
                      'AM925': 'name needed by the migrated code already used',
                      'AM926': 'output that cannot be moved to the main process safely',
                      'AM927': 'device placement that cannot be given to Fabric',
                      'AM928': 'backward that fabric.backward cannot take as written',
                      'AM929': 'training DataLoader that the processes cannot share out',
                      'AM930': "loop exit decided on each process's own value",
                      'AM931': "random draw in a loop that trains, alike on every process (a GAN's noise)",
                      'AM932': "global batch size shaping this process's share of the batch",
                      'AM933': "running total of a training loop read after it: one process's share of the "
                               'one-process total',
                      'AM934': "Fabric's defaults: on N processes the global batch is N times the "
                               "DataLoader's (fabric=parity keeps the original's)"},
            'notes': ('AM910', 'AM911', 'AM914', 'AM916', 'AM917', 'AM922', 'AM934'),
            'reads_handoffs': True,
            'needs_torch': (1, 12)},
 'accumulate': {'module': 'accumulate',
                'name': 'Accumulate',
                'summary': 'accumulate gradients over N micro-batches per optimizer step (--to accumulate=N)',
                'requires': (),
                'excludes': (),
                'triggers': ('backward', 'step'),
                'codes': {'AM600': 'training loop that steps the optimizer after every batch (accumulation '
                                   'over N micro-batches)',
                          'AM601': "the training loop's length cannot be known: accumulate by hand",
                          'AM602': "the training loop's shape cannot be proven: accumulate by hand",
                          'AM603': 'several backward passes or optimizers in one loop: accumulate by hand',
                          'AM604': 'backward() or the optimizer step outside the training loop: accumulate '
                                   'by hand',
                          'AM605': 'a per-batch learning-rate scheduler now steps once per group: rescale '
                                   'its step counts',
                          'AM606': 'DDP: micro-batches that do not end a group skip the gradient all-reduce '
                                   '(model.no_sync())',
                          'AM607': "the loss's reduction over the batch (mean or sum) cannot be read: "
                                   'accumulate by hand',
                          'AM608': "the Accelerator's gradient accumulation is set otherwise (or cannot be "
                                   'read): set it by hand',
                          'AM609': "accelerator.backward divides the mean loss by N: exact when the loader's "
                                   'length is a multiple of N',
                          'AM614': 'BatchNorm statistics computed on each micro-batch',
                          'AM610': 'the Accelerate step cannot be put under accelerator.accumulate(): '
                                   'prepare what the message names, or accumulate by hand',
                          'AM611': 'backward(loss) through an object that is neither an Accelerator nor a '
                                   'Fabric: accumulate by hand'},
                'notes': ('AM609', 'AM614'),
                'reads_handoffs': False,
                'needs_torch': (1, 12)},
 'batch-scale': {'module': 'batch_scale',
                 'name': 'BatchScale',
                 'summary': 'multiply the training batch size and the learning rate by K (--to '
                            'batch-scale=K)',
                 'requires': (),
                 'excludes': (),
                 'triggers': ('DataLoader',),
                 'codes': {'AM610': "training DataLoader's batch size multiplied by K",
                           'AM611': 'learning rate multiplied by K (linear scaling rule)',
                           'AM612': 'batch size or learning rate cannot be scaled safely: scale both by hand',
                           'AM613': 'large batch-scale factor: add a learning-rate warm-up'},
                 'notes': (),
                 'reads_handoffs': False,
                 'needs_torch': (0, 0)},
 'fused-optim': {'module': 'fused_optim',
                 'name': 'FusedOptim',
                 'summary': 'fused=True for Adam, AdamW and SGD where the parameters are on CUDA '
                            '(fused_on_cuda)',
                 'requires': (),
                 'excludes': (),
                 'triggers': ('Adam', 'SGD'),
                 'codes': {'AM740': 'Adam, AdamW or SGD without the fused CUDA implementation',
                           'AM741': 'optimizer whose parameters cannot be traced to modules here: pass '
                                    '`fused=` by hand',
                           'AM742': 'optimizer given `foreach=` or `differentiable=`, which exclude `fused=`',
                           'AM743': 'SGD left unfused: the file makes sparse embedding gradients, which '
                                    'fused SGD does not take'},
                 'notes': ('AM743',),
                 'reads_handoffs': False,
                 'needs_torch': (2, 3)},
 'compile': {'module': 'compile',
             'name': 'Compile',
             'summary': 'torch.compile on each trained model after placement and DDP (on CUDA), checkpoints '
                        'from the uncompiled module',
             'requires': (),
             'excludes': (),
             'triggers': ('backward',),
             'codes': {'AM701': 'trained model not compiled with torch.compile',
                       'AM702': 'model under nn.DataParallel: compile after ddp replaces it',
                       'AM703': 'no single place where the model is ready: compile it by hand',
                       'AM704': 'state dict of a compiled model carries `_orig_mod.` keys: save and load it '
                                'through unwrap_model'},
             'notes': (),
             'reads_handoffs': False,
             'needs_torch': (2, 0)},
 'tf32': {'module': 'tf32',
          'name': 'Tf32',
          'summary': 'float32 matmuls on CUDA in TF32 (torch.backends.cuda.matmul.fp32_precision), set once '
                     'at the start',
          'requires': (),
          'excludes': (),
          'triggers': ('backward',),
          'codes': {'AM710': 'float32 matmuls on CUDA without TF32',
                    'AM711': 'training runs only when another module calls this file: enable TF32 where the '
                             'script starts'},
          'notes': (),
          'reads_handoffs': False,
          'needs_torch': (1, 12)},
 'cudnn-benchmark': {'module': 'cudnn_benchmark',
                     'name': 'CudnnBenchmark',
                     'summary': 'torch.backends.cudnn.benchmark = True at the start, for conv nets with '
                                'inputs of fixed shape',
                     'requires': (),
                     'excludes': (),
                     'triggers': ('backward',),
                     'codes': {'AM720': 'conv net trained on fixed input shapes without cudnn.benchmark',
                               'AM721': 'cudnn.benchmark left off: no convolutions, or input shapes that may '
                                        'vary',
                               'AM722': 'deterministic kernels asked for: cudnn.benchmark would choose '
                                        'kernels by timing',
                               'AM723': 'training runs only when another module calls this file: set '
                                        'cudnn.benchmark where the script starts'},
                     'notes': ('AM721',),
                     'reads_handoffs': False,
                     'needs_torch': (0, 0)},
 'safe-load': {'module': 'safe_load',
               'name': 'SafeLoad',
               'summary': 'torch.load(..., weights_only=True) where what is loaded is a state dict',
               'requires': (),
               'excludes': (),
               'triggers': ('load',),
               'codes': {'AM750': 'torch.load of a state dict without weights_only=True',
                         'AM751': 'torch.load that may unpickle more than tensors: check the file, then pass '
                                  'weights_only=True'},
               'notes': (),
               'reads_handoffs': False,
               'needs_torch': (1, 13)}}  # fmt: skip
# --- end of generated table --------------------------------------------------

_START = "# --- generated: do not edit below by hand"
_END = "# --- end of generated table"
FIELDS = ("module", "name", "summary", "requires", "triggers", "codes", "notes", "reads_handoffs")


def entry_of(cls) -> dict:
    """A class's manifest entry (plain literals)."""
    return {
        "module": cls.__module__.rpartition(".")[2],
        "name": cls.__name__,
        "summary": cls.summary,
        "requires": tuple(cls.requires),
        "excludes": tuple(cls.excludes),
        "triggers": tuple(cls.triggers),
        "codes": dict(cls.codes),
        "notes": tuple(sorted(cls.notes)),
        "reads_handoffs": bool(cls.reads_handoffs),
        "needs_torch": tuple(cls.needs_torch),
        **({"handed_to": {code: tuple(words) for code, words in cls.handed_to.items()}} if cls.handed_to else {}),
    }


def generated() -> dict:
    """The table as the classes give it now (imports every codemod)."""
    from accelmigrate.codemods import all_codemods

    return {word: entry_of(cls) for word, cls in all_codemods().items()}


def render(table: dict) -> str:
    body = pprint.pformat(table, width=110, sort_dicts=False)
    return f"CODEMODS: dict = {body}  # fmt: skip\n"


def main() -> int:
    path = Path(__file__)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(_START))
    end = next(i for i, line in enumerate(lines) if line.startswith(_END))
    new = "".join([*lines[: start + 1], render(generated()), *lines[end:]])
    if new != "".join(lines):
        path.write_text(new, encoding="utf-8")
        print(f"updated {path}")
    else:
        print(f"{path} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
