"""``opsnn.optim``: optimizers with torch's names, signatures and parameter groups (SGD, Adam,
AdamW, NAdam, RAdam, Adamax, RMSprop, Adagrad, Adadelta); each ``step()`` is one fused multi-tensor numba kernel over all parameters.
Learning-rate schedulers are in ``opsnn.optim.lr_scheduler``.

>>> import opsnn, numpy as np
>>> lin = opsnn.nn.Linear(3, 1)
>>> opt = opsnn.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
>>> loss = opsnn.nn.functional.mse_loss(lin(opsnn.tensor(np.ones((2, 3), np.float32))), np.zeros((2, 1), np.float32))
>>> opt.zero_grad(); loss.backward(); opt.step()
"""

from . import lr_scheduler
from .adadelta import Adadelta
from .adagrad import Adagrad
from .adam import Adam, AdamW
from .adamax import Adamax
from .nadam import NAdam
from .optimizer import Optimizer, OptimizerStateError
from .radam import RAdam
from .rmsprop import RMSprop
from .sgd import SGD

__all__ = [
    "SGD",
    "Adadelta",
    "Adagrad",
    "Adam",
    "AdamW",
    "Adamax",
    "NAdam",
    "Optimizer",
    "OptimizerStateError",
    "RAdam",
    "RMSprop",
    "lr_scheduler",
]
