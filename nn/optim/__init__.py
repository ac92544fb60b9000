"""Optimizers and learning-rate schedules, as torch.optim: `nn.optim.AdamW`,
`nn.optim.lr_scheduler.StepLR`.

Every optimizer updates its parameters in place, under `ta.no_grad()` (nothing is
recorded) and `ta.memory.phase("optimizer")` (the ledger attributes what the step
allocates); state buffers are made once, on a parameter's first step, tagged
"optimizer_state", and reused after.

What a step allocates beyond that state, per parameter:
- SGD: no Storage (every term is folded in with `mul_` / `add_(x, alpha=a)`; the engine's
  `add_` with alpha != 1 forms `a * x` in one transient array, which the ledger's raw-allocator
  count sees but no Storage holds).
- AdamW (and Adam without weight decay): no Storage either. The update is one engine call per
  parameter group, `ta.functional.adamw_update_` on lists of tensors, which on CPU runs block
  by block through a small scratch buffer (or, compiled, in one parallel pass over the group);
  written as a chain of in-place ops it would need two parameter-sized temporaries
  (grad * grad and the denominator sqrt(v)), and PyTorch's own single-tensor AdamW
  allocates one (denom). maximize and Adam's coupled weight decay add one temporary (the
  gradient the update reads); amsgrad runs as a chain of ops (see adam.py).
- Adadelta, RMSprop, Adagrad, NAdam, RAdam, Adamax, Rprop, ASGD: chains of engine ops with a few
  parameter-sized temporaries, each freed within the step (counted in adaptive.py and
  adam_variants.py and classic.py).

`foreach`, `fused` and `capturable` are accepted for torch's signatures: they choose among
torch's implementations of one rule, and there is one here, so they change nothing.
`differentiable=True` raises RuntimeError.
"""

from . import lr_scheduler
from .adam import Adam, AdamW, configure_adamw
from .adam_variants import Adamax, NAdam, RAdam
from .adaptive import Adadelta, Adagrad, RMSprop
from .classic import ASGD, Rprop
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "Adadelta", "RMSprop", "Adagrad", "NAdam",
           "RAdam", "Adamax", "Rprop", "ASGD", "configure_adamw", "lr_scheduler"]
