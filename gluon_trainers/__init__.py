"""Gluon integration for kvstore_ext: a batched Trainer, small models and data helpers."""
from .trainer import Trainer, start_together

__all__ = ["Trainer", "start_together"]
