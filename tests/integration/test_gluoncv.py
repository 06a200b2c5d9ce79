"""scripts/train_gluoncv.py: GluonCV models through launch.py, missing data and unknown models named
cleanly, ImageNet record files, and a resumed run that matches an uninterrupted one exactly."""
import csv
import os
import sys

import mxnet as mx
import numpy as np
import pytest
from conftest import ROOT, read_json

TRAIN = os.path.join(ROOT, "scripts", "train_gluoncv.py")
#: one model of each family trains in a job; the deeper members of a family (the same GluonCV
#: class with more layers) are built and stepped in this process (below), which costs seconds
MODELS = ["cifar_resnet56_v1", "resnet50_v1", "vgg16", "alexnet_small"]
DEEPER = ["cifar_resnet110_v1", "resnet101_v1", "resnet152_v1"]


def run_alone(jobs, *args, timeout=300):
    """One training process without a launcher; (exit code, stdout and stderr)."""
    job = jobs([sys.executable, TRAIN, *args])
    return job.wait(timeout), job.output


@pytest.mark.parametrize("model", MODELS)
def test_model_trains_two_iterations_on_two_workers(run_job, tmp_path, model):
    out = str(tmp_path / "worker-{rank}.json")
    code, log = run_job(2, 1, [TRAIN, "--kvstore", "dist_bsp", "--dataset", "synthetic",
                               "--model", model, "--classes", "10", "--image-size", "32",
                               "--batch-size", "2", "--train-size", "16", "--test-size", "4",
                               "--num-iterations", "2", "--out", out], timeout=180)
    assert code == 0, log[-3000:]
    for rank in range(2):
        result = read_json(out.replace("{rank}", str(rank)))
        assert result["iterations"] == result["steps"] == 2, result
        assert result["kvstore_stats"]["worker"]["iterations"] == 2
        assert result["model"] == model and result["num_workers"] == 2
        (point,) = result["accuracy_curve"]   # 8 images per worker: stopped half way into epoch 1
        assert point["epoch"] == 0.5 and 0 <= point["test_accuracy"] <= 1
        assert result["final_accuracy"] == point["test_accuracy"]


@pytest.mark.parametrize("model", DEEPER)
def test_deeper_recipe_models_build_and_take_a_step(model):
    """train_gluoncv's own model factory; one forward, backward and SGD step on 2 images."""
    sys.path.insert(0, os.path.dirname(TRAIN))
    try:
        from train_gluoncv import build_model
    finally:
        sys.path.remove(os.path.dirname(TRAIN))
    net = build_model(model, 10)
    net.initialize(mx.init.Xavier())
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
    x, y = mx.nd.random.uniform(shape=(2, 3, 32, 32)), mx.nd.array([1, 7])
    with mx.autograd.record():
        loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y)
    loss.backward()
    before = [p.data().copy() for p in net.collect_params().values() if p.grad_req != "null"]
    trainer.step(2)
    after = [p.data() for p in net.collect_params().values() if p.grad_req != "null"]
    assert np.isfinite(loss.asnumpy()).all()
    assert sum(float((a - b).abs().sum().asscalar()) > 0 for a, b in zip(after, before)) \
        >= 0.9 * len(before)


@pytest.mark.parametrize("dataset,files,folder,archive", [
    ("cifar10", [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"],
     "cifar-10-batches-bin", "cifar-10-binary.tar.gz"),
    ("cifar100", ["train.bin", "test.bin"], "cifar-100-binary", "cifar-100-binary.tar.gz"),
])
def test_missing_cifar_names_the_files_and_how_to_get_them(jobs, tmp_path, dataset, files,
                                                           folder, archive):
    code, log = run_alone(jobs, "--dataset", dataset, "--data-dir", str(tmp_path),
                          "--model", "alexnet_small", "--kvstore", "local")
    assert code == 2, log[-3000:]
    assert "Traceback" not in log
    for name in files:   # Gluon's layout, and the official archive unpacked in --data-dir
        assert os.path.join(str(tmp_path), name) in log
        assert os.path.join(str(tmp_path), folder, name) in log
    assert f"https://www.cs.toronto.edu/~kriz/{archive}" in log and "--download" in log


def test_missing_imagenet_names_the_record_files(jobs, tmp_path):
    code, log = run_alone(jobs, "--dataset", "imagenet", "--data-dir", str(tmp_path),
                          "--model", "resnet50_v1", "--kvstore", "local")
    assert code == 2 and "Traceback" not in log, log[-3000:]
    for name in ("train.rec", "train.idx", "val.rec", "val.idx"):
        assert os.path.join(str(tmp_path), name) in log


def test_unknown_model_is_a_clear_error(jobs):
    code, log = run_alone(jobs, "--dataset", "synthetic", "--model", "resnet_fifty",
                          "--kvstore", "local")
    assert code == 2 and "Traceback" not in log, log[-3000:]
    assert "unknown model 'resnet_fifty'" in log and "get_model_list" in log


def write_records(folder, name, count, classes):
    """A small ImageNet-style record file and its index: JPEGs of random pixels."""
    rng = np.random.RandomState(count)
    rec = mx.recordio.MXIndexedRecordIO(str(folder / f"{name}.idx"), str(folder / f"{name}.rec"), "w")
    for i in range(count):
        image = rng.randint(0, 256, (48, 40, 3)).astype(np.uint8)
        header = mx.recordio.IRHeader(0, float(i % classes), i, 0)
        rec.write_idx(i, mx.recordio.pack_img(header, image, quality=90, img_fmt=".jpg"))
    rec.close()


def test_imagenet_record_files_train_and_test(jobs, tmp_path):
    write_records(tmp_path, "train", 24, 4)
    write_records(tmp_path, "val", 10, 4)
    out = str(tmp_path / "result.json")
    code, log = run_alone(jobs, "--dataset", "imagenet", "--data-dir", str(tmp_path),
                          "--model", "alexnet_small", "--classes", "4", "--image-size", "32",
                          "--batch-size", "4", "--epochs", "2", "--lr", "0.01",
                          "--kvstore", "local", "--out", out)
    assert code == 0, log[-3000:]
    result = read_json(out)
    assert result["iterations"] == 12        # 24 images / batch 4, twice
    assert [p["epoch"] for p in result["accuracy_curve"]] == [1, 2]
    assert result["accuracy_curve"][-1]["test_accuracy"] in [i / 10 for i in range(11)]


@pytest.mark.long
def test_resume_continues_exactly_like_an_uninterrupted_run(jobs, tmp_path):
    """2 epochs in one go vs 1 epoch, a checkpoint, and --resume for the second: same losses at
    every iteration and the same final weights (the rate decays at epoch 1: the schedule too)."""
    common = ["--dataset", "mnist", "--model", "cifar_resnet20_v1", "--train-size", "1000",
              "--test-size", "200", "--batch-size", "50", "--lr", "0.05", "--lr-decay-epoch", "1",
              "--no-wd-bn-bias", "--log-interval", "1", "--kvstore", "local"]
    whole, part, resumed = (str(tmp_path / n) for n in ("whole", "part", "resumed"))
    ckpt = str(tmp_path / "ckpt")
    runs = [(whole, ["--epochs", "2"]),
            (part, ["--epochs", "1", "--save-dir", ckpt]),
            (resumed, ["--epochs", "2", "--resume", ckpt, "--log-dir", str(tmp_path / "logs")])]
    for name, extra in runs:
        code, log = run_alone(jobs, *common, *extra, "--out", name + ".json",
                              "--save-params", name + ".params")
        assert code == 0, log[-3000:]
    assert sorted(os.listdir(ckpt)) == ["rank0-epoch0001.json", "rank0-epoch0001.params",
                                        "rank0-epoch0001.states"]
    a, b = read_json(whole + ".json"), read_json(resumed + ".json")
    assert len(a["loss_curve"]) == len(b["loss_curve"]) == 40
    np.testing.assert_allclose(np.array(b["loss_curve"]), np.array(a["loss_curve"]), rtol=1e-5,
                               atol=1e-6)
    assert [p["test_accuracy"] for p in b["accuracy_curve"]] == \
           [p["test_accuracy"] for p in a["accuracy_curve"]]
    wa, wb = mx.nd.load(whole + ".params"), mx.nd.load(resumed + ".params")
    assert wa.keys() == wb.keys()
    for k in wa:
        np.testing.assert_allclose(wb[k].asnumpy(), wa[k].asnumpy(), rtol=1e-5, atol=1e-7,
                                   err_msg=k)
    # the first epoch's weights differ from the end: the comparison covers the second epoch
    wp = mx.nd.load(part + ".params")
    assert any(not np.allclose(wp[k].asnumpy(), wa[k].asnumpy()) for k in wa)
    with open(tmp_path / "logs" / "rank0.csv") as f:
        assert [row["epoch"] for row in csv.DictReader(f)] == ["1.0", "2.0"]


def test_resume_under_dist_bsp_continues_the_servers_optimizer(run_job, tmp_path):
    """With the optimizer on the servers, the checkpoint must carry its momentum and where its
    schedule is: 2 workers, 2 epochs vs 1 + --resume 1, the rate decaying at epoch 1."""
    common = [TRAIN, "--kvstore", "dist_bsp", "--dataset", "synthetic", "--model",
              "cifar_resnet20_v1", "--train-size", "128", "--test-size", "16", "--batch-size", "16",
              "--lr", "0.05", "--lr-decay-epoch", "1", "--lr-decay", "0.01", "--log-interval", "1"]
    ckpt = str(tmp_path / "ckpt")
    for name, extra in [("whole", ["--epochs", "2"]), ("part", ["--epochs", "1", "--save-dir", ckpt]),
                        ("resumed", ["--epochs", "2", "--resume", ckpt])]:
        code, log = run_job(2, 1, [*common, *extra, "--out", str(tmp_path / f"{name}-{{rank}}.json")])
        assert code == 0, log[-3000:]
    for rank in range(2):
        a = read_json(str(tmp_path / f"whole-{rank}.json"))["loss_curve"]
        b = read_json(str(tmp_path / f"resumed-{rank}.json"))["loss_curve"]
        assert len(a) == len(b) == 8
        np.testing.assert_allclose(np.array(b), np.array(a), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kvstore", ["dist_ssgd", "dist_dcs3gd"])
def test_horovod_stores_train_a_convolutional_model(jobs, tmp_path, kvstore):
    """Convolutions' MKL-DNN layouts must not reach Horovod's allreduce (it crashed on them)."""
    out = str(tmp_path / "worker-{rank}.json")
    job = jobs([sys.executable, os.path.join(ROOT, "scripts", "launch.py"), "-n", "2",
                "--launcher", "horovod", sys.executable, TRAIN, "--kvstore", kvstore,
                "--dataset", "synthetic", "--model", "cifar_resnet20_v1", "--classes", "10",
                "--image-size", "32", "--batch-size", "8", "--train-size", "160",
                "--test-size", "16", "--num-iterations", "6", "--out", out],
               env={"OMP_NUM_THREADS": "1"})
    assert job.wait(240) == 0, job.output[-3000:]
    for rank in range(2):
        result = read_json(out.replace("{rank}", str(rank)))
        assert result["steps"] == 6 and result["kvstore_stats"]["type"] == kvstore
