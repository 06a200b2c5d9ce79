"""Gluon integration for kvstore_ext: a batched Trainer, small models and data helpers."""
from .trainer import Trainer

__all__ = ["Trainer"]
