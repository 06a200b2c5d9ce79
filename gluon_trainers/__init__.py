"""Gluon integration for kvstore_ext: a batched Trainer, small models and data helpers."""
from .trainer import Trainer, make_kvstore, start_together

__all__ = ["Trainer", "make_kvstore", "start_together"]
