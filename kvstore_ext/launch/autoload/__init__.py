"""The folder ``launch.py`` puts first on its workers' ``PYTHONPATH``: its ``sitecustomize``
registers kvstore_ext's stores once a script imports mxnet (see there)."""
import os

#: the folder itself, as it goes on ``PYTHONPATH``
FOLDER = os.path.dirname(os.path.abspath(__file__))
