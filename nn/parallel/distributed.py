"""nn.parallel.DistributedDataParallel: torch's data-parallel wrapper, on ta.distributed.

One process per rank runs the same model on its share of the batch. At construction rank
0's parameters and buffers are broadcast, so every rank starts equal. In backward each
parameter's gradient, once the engine has summed it into .grad, is marked ready (a
post-accumulate-grad hook); when a bucket's last gradient is ready the bucket is divided by
the world size and its all-reduce is issued asynchronously, buckets strictly in their
fixed order, so communication runs on ta.distributed's communication thread while backward
goes on computing the earlier layers' gradients. At the end of backward (a callback the
engine runs before backward() returns) every all-reduce is waited for and the averaged
gradients are in .grad: the same as one process with the whole batch, up to the order of
the floating-point sums.

Memory: each bucket is one flat buffer, tagged "bucket" in the ledger. With the default
`gradient_as_bucket_view=False` a gradient is copied into its bucket before the all-reduce
and back after it (the gradients and the buckets: two copies). With True, each .grad
becomes a view into its bucket (one copy; the gradient category then shows in "bucket").
docs/distributed.md has the design, the timeline and the measurements.
"""

from __future__ import annotations

import contextlib
import time

import tinygrad_attn as ta
import tinygrad_attn.distributed as dist

from ..module import Module
from .buckets import DEFAULT_BUCKET_CAP_MB, FIRST_BUCKET_BYTES, Bucket, CommRecord, assign

_UNUSED_TEXT = (
    "Expected to have finished reduction in the prior iteration before starting a new one. "
    "This error indicates that your module has parameters that were not used in producing "
    "loss. You can enable unused parameter detection by passing the keyword argument "
    "`find_unused_parameters=True` to `nn.parallel.DistributedDataParallel`, and by making "
    "sure all `forward` function outputs participate in calculating loss.")


def _tensors_in(obj):
    """The tensors in a forward's output (a tensor, or nested tuples, lists and dicts)."""
    if isinstance(obj, ta.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            yield from _tensors_in(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors_in(x)


def _reached_leaves(outputs) -> set:
    """ids of the leaf tensors the outputs' graph reaches (what find_unused_parameters
    walks after every forward)."""
    seen, found = set(), set()
    stack = [t.grad_fn for t in _tensors_in(outputs) if t.grad_fn is not None]
    stack += [t for t in _tensors_in(outputs) if t.grad_fn is None and t.requires_grad]
    while stack:
        node = stack.pop()
        if isinstance(node, ta.Tensor):
            found.add(id(node))
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        var = getattr(node, "variable", None)
        if var is not None:
            found.add(id(var))
        for edge in node.next_functions:
            if edge is not None and edge[0] is not None:
                stack.append(edge[0])
    return found


class DistributedDataParallel(Module):
    """torch.nn.parallel.DistributedDataParallel on the default process group (MPI).

    Saves nothing for backward of its own: the wrapped module's nodes save what they save;
    DDP adds the buckets (one flat gradient buffer per bucket) and, without
    gradient_as_bucket_view, keeps .grad as well."""

    def __init__(self, module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool = True, init_sync: bool = True, process_group=None,
                 bucket_cap_mb=None, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False,
                 static_graph: bool = False, delay_all_reduce_named_params=None,
                 param_to_hook_all_reduce=None, mixed_precision=None, device_mesh=None):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError("DistributedDataParallel: module must be an nn.Module, got "
                            f"{type(module).__name__}")
        for name, value in (("mixed_precision", mixed_precision), ("device_mesh", device_mesh),
                            ("delay_all_reduce_named_params", delay_all_reduce_named_params),
                            ("param_to_hook_all_reduce", param_to_hook_all_reduce)):
            if value is not None:
                raise NotImplementedError(f"DistributedDataParallel: {name} is not supported "
                                          "by tinygrad_attn")
        self.process_group = process_group
        self._world = dist.get_world_size(process_group)  # raises before init_process_group
        self._rank = dist.get_rank(process_group)
        self.module = module
        self.device_ids = device_ids
        self.output_device = output_device
        self.dim = dim
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        cap_mb = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        self.bucket_bytes_cap = int(cap_mb * 1024 * 1024)

        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't "
                               "have any parameter that requires a gradient.")
        devices = {p.device for _, p in named}
        if len(devices) > 1:
            raise ValueError("DistributedDataParallel's input module must be on the same "
                             f"type of devices, but input module parameters locate in {devices}.")
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._owner = self._owners(module)
        self._check_same_shapes()
        if init_sync:
            self._sync_module_states()

        caps = (min(FIRST_BUCKET_BYTES, self.bucket_bytes_cap), self.bucket_bytes_cap)
        self._buckets = []
        self._where = {}  # id(param) -> (bucket, position in it)
        for b, indices in enumerate(assign(self._params, *caps)):
            bucket = Bucket(b, [self._params[i] for i in indices],
                            [self._names[i] for i in indices])
            self._buckets.append(bucket)
            for k, i in enumerate(indices):
                self._where[id(self._params[i])] = (bucket, k)
        self._grad_hooks = [p.register_post_accumulate_grad_hook(self._grad_ready)
                       for p in self._params]
        self._step = 0
        self._expect_backward = False  # a forward under sync prepared a backward
        self._in_backward = False
        self._ready: set = set()
        self._next_bucket = 0
        self._unused_error = None
        self._local_unused: set = set()
        self._record = None
        self.comm_records: list = []  # one CommRecord per synchronised backward

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _owners(module) -> dict:
        """id(param) -> 'the module that registered it', for error messages."""
        owner = {}
        for prefix, m in module.named_modules():
            for pname, p in m._parameters.items():
                if p is not None and id(p) not in owner:
                    where = prefix or "the wrapped module"
                    owner[id(p)] = f"registered as {pname!r} by {type(m).__name__} at {where}"
        return owner

    def _check_same_shapes(self) -> None:
        """Every rank must wrap the same parameters: compare a fingerprint of the shapes."""
        if self._world == 1:
            return
        sig = [len(self._params)] + [s for p in self._params for s in (p.ndim, *p.shape)]
        mine = ta.tensor([len(sig)] + sig, dtype=ta.int64)
        size = ta.tensor([mine.numel()], dtype=ta.int64)
        largest = size.clone()
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=self.process_group)
        padded = ta.full((int(largest.item()),), -1, dtype=ta.int64)
        padded[:mine.numel()] = mine
        low, high = padded.clone(), padded.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN, group=self.process_group)
        dist.all_reduce(high, op=dist.ReduceOp.MAX, group=self.process_group)
        if not bool((low == high).all()):
            shapes = ", ".join(f"{n} {tuple(p.shape)}" for n, p in zip(self._names, self._params))
            raise RuntimeError(
                f"DistributedDataParallel: rank {self._rank} wraps parameters whose number or "
                "shapes differ from another rank's; every rank must build the same model. "
                f"This rank's: {shapes}")

    def _sync_module_states(self) -> None:
        """Rank 0's parameters and buffers, everywhere (broadcast, in place)."""
        if self._world == 1:
            return
        with ta.no_grad():
            for t in list(self._params) + [b for _, b in self.module.named_buffers()]:
                dist.broadcast(t.detach(), src=0, group=self.process_group)

    # ------------------------------------------------------------------ forward
    def forward(self, *inputs, **kwargs):
        if self._unused_error is not None:
            message, self._unused_error = self._unused_error, None
            raise RuntimeError(message)
        if self._expect_backward and self._ready:
            self._finish_incomplete()
        if self.require_forward_param_sync and self.broadcast_buffers and self._world > 1:
            with ta.no_grad():
                for _, b in self.module.named_buffers():
                    dist.broadcast(b.detach(), src=0, group=self.process_group)
        out = self.module(*inputs, **kwargs)
        sync = ta.is_grad_enabled() and self.require_backward_grad_sync
        self._expect_backward = sync
        if sync:
            self._prepare_backward(out)
        return out

    def _prepare_backward(self, out) -> None:
        self._ready = set()
        self._next_bucket = 0
        for bucket in self._buckets:
            bucket.reset()
        self._record = CommRecord(self._step)
        if self.find_unused_parameters:
            reached = _reached_leaves(out)
            self._local_unused = {id(p) for p in self._params if id(p) not in reached}
        else:
            self._local_unused = set()
        record = self._record
        for t in _tensors_in(out):
            if t.requires_grad and t.grad_fn is not None:
                def started(g, record=record):
                    if record.backward_start is None:
                        record.backward_start = time.perf_counter()
                t.register_hook(started)

    @contextlib.contextmanager
    def no_sync(self):
        """Backwards of forwards run inside only accumulate into .grad (no all-reduce);
        the first backward after the block reduces the accumulated sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    # ------------------------------------------------------------------ backward
    def _grad_ready(self, param) -> None:
        if not self._expect_backward:
            return  # under no_sync, or a backward that no forward of ours prepared
        if not self._in_backward:
            self._in_backward = True
            ta.autograd.queue_callback(self._end_of_backward)
            if self._record.backward_start is None:
                self._record.backward_start = time.perf_counter()
            for p in self._params:  # find_unused_parameters: ready now, as zeros
                if id(p) in self._local_unused:
                    self._mark_ready(p)
        self._mark_ready(param)

    def _mark_ready(self, param) -> None:
        key = id(param)
        if key in self._ready:
            raise RuntimeError(
                "DistributedDataParallel: the gradient of parameter "
                f"{self._name_of(param)} became ready twice in one backward (a parameter "
                "used in a reentrant backward, or by two forwards before one backward); "
                "torch raises for this too ('marked ready twice')")
        self._ready.add(key)
        bucket, _ = self._where[key]
        bucket.pending -= 1
        while (self._next_bucket < len(self._buckets)
               and self._buckets[self._next_bucket].pending == 0):
            self._launch(self._buckets[self._next_bucket])
            self._next_bucket += 1

    def _launch(self, bucket: Bucket) -> None:
        with ta.no_grad():
            for p, view in zip(bucket.params, bucket.views):
                g = p.grad
                if g is None:  # unused here (find_unused_parameters): contributes zeros
                    view.zero_()
                elif g is not view:
                    if g.shape != view.shape:  # a user's .grad of another shape
                        raise RuntimeError(
                            f"DistributedDataParallel: the gradient of {self._name_of(p)} has "
                            f"shape {tuple(g.shape)}, the parameter {tuple(p.shape)}")
                    view.copy_(g)
                    if self.gradient_as_bucket_view:
                        p.grad = view
            bucket.buffer.div_(self._world)
            bucket.issued = time.perf_counter()
            bucket.work = dist.all_reduce(bucket.buffer, op=dist.ReduceOp.SUM,
                                          group=self.process_group, async_op=True)

    def _end_of_backward(self) -> None:
        record = self._record
        record.backward_end = time.perf_counter()
        self._in_backward = False
        self._expect_backward = False
        launched = self._buckets[:self._next_bucket]
        for bucket in launched:
            bucket.work.wait()
        record.waited = time.perf_counter()
        unused_everywhere = self._unused_on_every_rank() if self.find_unused_parameters else set()
        with ta.no_grad():
            for bucket in launched:
                record.add(bucket)
                for p, view in zip(bucket.params, bucket.views):
                    if id(p) in unused_everywhere:
                        continue  # as torch: no rank used it, its .grad stays as it was
                    if self.gradient_as_bucket_view:
                        if p.grad is not view:
                            p.grad = view
                    elif p.grad is None:
                        p.grad = view.clone()
                    else:
                        p.grad.copy_(view)
        self.comm_records.append(record)
        del self.comm_records[:-64]  # the recent ones are what anyone reads
        self._step += 1
        if self._next_bucket < len(self._buckets):
            self._unused_error = self._unused_message()
            self._ready = set()

    def _unused_on_every_rank(self) -> set:
        """The parameters no rank used in this step (one all-reduce of a 0/1 usage map)."""
        used = ta.tensor([0 if id(p) in self._local_unused else 1 for p in self._params],
                         dtype=ta.int32)
        dist.all_reduce(used, op=dist.ReduceOp.MAX, group=self.process_group)
        return {id(p) for p, u in zip(self._params, used.tolist()) if u == 0}

    def _finish_incomplete(self) -> None:
        """A forward that follows a forward whose backward never reached the end."""
        self._unused_error = None
        raise RuntimeError(self._unused_message())

    def _unused_message(self) -> str:
        missing = [(i, n, p) for i, (n, p) in enumerate(zip(self._names, self._params))
                   if id(p) not in self._ready]
        indices = " ".join(str(i) for i, _, _ in missing)
        listed = "; ".join(f"{n} (shape {tuple(p.shape)}, {self._owner.get(id(p), '?')})"
                           for _, n, p in missing)
        return (f"{_UNUSED_TEXT}\nParameter indices which did not receive grad for rank "
                f"{self._rank}: {indices}\nParameters which did not receive grad for rank "
                f"{self._rank}: {listed}")

    def _name_of(self, param) -> str:
        for n, p in zip(self._names, self._params):
            if p is param:
                return n
        return f"a parameter of shape {tuple(param.shape)}"

    # ------------------------------------------------------------------ reading
    @property
    def buckets(self) -> list:
        """(bytes, [parameter names]) per bucket, in the order they are reduced."""
        return [(b.nbytes, list(b.names)) for b in self._buckets]

    def comm_timeline(self) -> CommRecord | None:
        """The last synchronised backward's all-reduces, relative to that backward."""
        return self.comm_records[-1] if self.comm_records else None

    def extra_repr(self) -> str:
        return (f"world_size={self._world}, buckets={len(self._buckets)}, "
                f"gradient_as_bucket_view={self.gradient_as_bucket_view}")
