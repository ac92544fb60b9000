"""The op layer: one Function class per op, forward and backward side by side.

The functions re-exported here are what Tensor's methods call.
"""

from .attention import scaled_dot_product_attention  # noqa: F401
from .elementwise import (  # noqa: F401
    abs,
    add,
    any_all,
    clamp,
    compare,
    div,
    exp,
    floor_divide,
    gelu,
    log,
    logical,
    logical_not,
    maximum,
    minimum,
    mul,
    neg,
    pow,
    relu,
    remainder,
    rsqrt,
    sigmoid,
    silu,
    sqrt,
    sub,
    tanh,
)
from .indexing import (  # noqa: F401
    advanced_index,
    cat,
    gather,
    index_select,
    masked_fill,
    stack,
    tril,
    triu,
    where,
)
from .inplace import adamw_update_, inplace, setitem  # noqa: F401
from .movement import (  # noqa: F401
    as_strided,
    chunk,
    clone,
    contiguous,
    expand,
    flatten,
    getitem,
    narrow,
    permute,
    reshape,
    split,
    squeeze,
    to,
    transpose,
    unbind,
    unflatten,
    unsqueeze,
    view,
)
from .nn import cross_entropy, dropout, embedding, layer_norm  # noqa: F401
from .reduce import (  # noqa: F401
    argmax,
    argmin,
    log_softmax,
    logsumexp,
    matmul,
    max,
    mean,
    min,
    softmax,
    sum,
    var,
)
