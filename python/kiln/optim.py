"""Optimizers as graph builders: each returns the assign ops of one step, for compile's updates."""
from ._kiln.optim import *  # noqa: F401,F403
from ._kiln.optim import sgd, adam, adamw, rmsprop, apply_if, scale_loss_and_step, LossScaled  # noqa: F401
