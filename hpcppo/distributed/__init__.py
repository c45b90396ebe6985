"""Distributed plumbing: job environment, device meshes, FSDP2, weight streaming, checkpoints.

Import the submodules directly. This package's ``__init__`` imports nothing so that ``hpcppo.rundir.checkpoints``
(checkpoint listing for the login-node CLI) stays free of torch.
"""
