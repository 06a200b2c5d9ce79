"""Run by Python at start-up in the workers of a job that ``launch.py`` starts (it puts this
folder first on their ``PYTHONPATH``): once the script imports mxnet, kvstore_ext is imported
too, so that an unmodified MXNet script can name kvstore_ext's stores
(``train_mnist.py --kv-store dist_bsp``) as it names MXNet's own, without ``import
kvstore_ext``.  Without it MXNet hands such a name to ps-lite, which dies on a missing
``DMLC_NUM_WORKER``.  ``launch.py --no-autoload`` leaves the workers' Python alone.

Nothing is imported until the script imports mxnet; a ``sitecustomize`` further along the
path (a distribution's own) still runs.  If kvstore_ext cannot be imported, mxnet still is
and the reason is printed.
"""
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))   # holds kvstore_ext/


def _register_stores() -> None:
    if importlib.util.find_spec("kvstore_ext") is None and _ROOT not in sys.path:
        sys.path.append(_ROOT)      # a checkout, not an installed package
    try:
        importlib.import_module("kvstore_ext")
    except Exception as exc:        # mxnet itself stays usable
        print(f"kvstore_ext: its stores are not registered ({type(exc).__name__}: {exc}); "
              f"add 'import kvstore_ext' to the script to see the whole error",
              file=sys.stderr, flush=True)


class _ThenRegister(importlib.abc.Loader):
    """mxnet's own loader, and kvstore_ext's import once mxnet's has run."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _register_stores()

    def __getattr__(self, name):     # get_filename, is_package, get_resource_reader, ...
        return getattr(self._loader, name)


class _WatchForMXNet(importlib.abc.MetaPathFinder):
    """Steps in once, for the first ``import mxnet``; every other import is left alone."""

    def find_spec(self, name, path=None, target=None):
        if name != "mxnet":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenRegister(spec.loader)
        return spec


def _run_next_sitecustomize() -> None:
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)


if "mxnet" in sys.modules:
    _register_stores()
else:
    sys.meta_path.insert(0, _WatchForMXNet())
_run_next_sitecustomize()
