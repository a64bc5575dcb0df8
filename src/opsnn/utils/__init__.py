"""torch.utils-shaped helpers: :mod:`opsnn.utils.data` (``Dataset``, ``TensorDataset``, ``DataLoader``, the samplers, ``DistributedSampler``)."""
