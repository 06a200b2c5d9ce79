"""The planner: how many workers and servers, which batch size and which store for a model.

After Yan et al., "Performance Modeling and Scalability Optimization of Distributed Deep
Learning Systems" (KDD 2015): a model of the time per iteration built from measured costs
(:mod:`.model`), calibrated on the machine it runs on (:mod:`.calibrate`), an optimizer over
configurations (:mod:`.search`), and a check against real jobs (:mod:`.validate`).

    python -m kvstore_ext.plan calibrate --out results/plan/calibration.json
    python -m kvstore_ext.plan predict --model lenet -n 4 -s 2 --store dist_bsp --device 150ms
    python -m kvstore_ext.plan search --model cifar_resnet20_v1 --machines 16 --device v100
    python -m kvstore_ext.plan validate --trials 3

:mod:`.model` and :mod:`.search` are pure (numpy): they import neither runtime.
"""
from .model import BOTTLENECKS, Costs, ModelProfile, Prediction, iteration_time, predict

__all__ = ["BOTTLENECKS", "Costs", "ModelProfile", "Prediction", "iteration_time", "predict"]
