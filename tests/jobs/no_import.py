"""A worker script as MXNet users write it, naming a store without ``import kvstore_ext``:
launch.py's autoload registers the stores when it imports mxnet.  One gluon.Trainer step
on a one-weight Dense layer; prints the store's type and module and the weight."""
import json
import sys

import mxnet as mx
from mxnet import autograd, gluon

kvstore = sys.argv[1]
net = gluon.nn.Dense(1, use_bias=False, in_units=2)
net.initialize(mx.init.One())
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5}, kvstore=kvstore)
with autograd.record():
    loss = net(mx.nd.array([[1.0, 2.0]])).sum()
loss.backward()
trainer.step(1)
kv = trainer._kvstore
print("RESULT " + json.dumps({"type": kv.type, "module": type(kv).__module__, "rank": kv.rank,
                              "weight": net.weight.data().asnumpy().tolist(),
                              "preloaded": "kvstore_ext" in sys.modules}), flush=True)
