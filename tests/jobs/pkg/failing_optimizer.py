"""An SGD that fails on the server at a given update (to test that such errors are not lost)."""
import mxnet as mx


@mx.optimizer.register
class FailingSGD(mx.optimizer.SGD):
    def __init__(self, fail_at=10, **kwargs):
        super().__init__(**kwargs)
        self.fail_at = fail_at
        self.done = 0

    def update_multi_precision(self, index, weight, grad, state):
        self.done += 1
        if self.done >= self.fail_at:
            raise RuntimeError(f"update {self.done} failed on purpose")
        super().update_multi_precision(index, weight, grad, state)
