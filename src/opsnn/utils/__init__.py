"""torch.utils-shaped helpers: :mod:`opsnn.utils.data` (``DistributedSampler``)."""
