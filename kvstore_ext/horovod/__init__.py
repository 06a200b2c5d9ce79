"""The decentralised stores on Horovod (``dist_dcs3gd``, ``dist_ssgd``).

:mod:`.params` checks their parameters without mxnet or horovod; :mod:`.store` holds the
``KVStoreBase`` classes (horovod is imported on first use); :mod:`.overlap` measures how
much communication the computation hides.
"""
