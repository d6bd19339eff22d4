"""apex.amp as fp32 computes it: nothing cast, the loss unscaled."""

import contextlib


def initialize(models, optimizers=None, **settings):
    return models if optimizers is None else (models, optimizers)


@contextlib.contextmanager
def scale_loss(loss, optimizers, **settings):
    yield loss


def master_params(optimizer):
    for group in optimizer.param_groups:
        yield from group["params"]
