"""Convolution and pooling layers (torch.nn's names, arguments, parameter names and
default initialisation), each a thin Module over one functional op."""

from __future__ import annotations

import math

import tinygrad_attn as ta

from . import functional as F
from . import init
from .module import Module, Parameter


def _ntuple(value, n: int) -> tuple:
    return (value,) * n if isinstance(value, int) else tuple(value)


class _ConvNd(Module):
    """weight (out, in/groups, *k) or, transposed, (in, out/groups, *k); bias (out,).

    Initialised as torch: weight kaiming_uniform_(a=sqrt(5)), i.e. U(-1/sqrt(fan_in),
    1/sqrt(fan_in)), and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    """

    n = 2
    transposed = False

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, bias=True, padding_mode="zeros", output_padding=0,
                 device=None, dtype=None) -> None:
        super().__init__()
        name = type(self).__name__
        if groups <= 0 or in_channels % groups or out_channels % groups:
            raise ValueError(f"{name}: in_channels ({in_channels}) and out_channels "
                             f"({out_channels}) must be divisible by groups ({groups})")
        if padding_mode != "zeros":
            raise NotImplementedError(f"{name}: padding_mode {padding_mode!r} is not "
                                      "supported (only 'zeros')")
        n = self.n
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride = _ntuple(kernel_size, n), _ntuple(stride, n)
        self.padding = padding if isinstance(padding, str) else _ntuple(padding, n)
        self.dilation, self.output_padding = _ntuple(dilation, n), _ntuple(output_padding, n)
        self.padding_mode = padding_mode
        shape = ((in_channels, out_channels // groups) if self.transposed
                 else (out_channels, in_channels // groups)) + self.kernel_size
        kw = {"dtype": dtype, "device": device}
        self.weight = Parameter(ta.empty(*shape, **kw))
        self.bias = Parameter(ta.empty(out_channels, **kw)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
            init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0,) * self.n:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * self.n:
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + ("" if self.bias is not None else ", bias=False")


class Conv1d(_ConvNd):
    n = 1

    def forward(self, x):
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class Conv2d(_ConvNd):
    n = 2

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class ConvTranspose1d(_ConvNd):
    n, transposed = 1, True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, padding_mode="zeros",
                 device=None, dtype=None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, output_padding, device, dtype)

    def forward(self, x):
        return F.conv_transpose1d(x, self.weight, self.bias, self.stride, self.padding,
                                  self.output_padding, self.groups, self.dilation)


class ConvTranspose2d(ConvTranspose1d):
    n = 2

    def forward(self, x):
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                  self.output_padding, self.groups, self.dilation)


class _MaxPoolNd(Module):
    fn = None

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                 return_indices=False, ceil_mode=False) -> None:
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None \
            else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x):
        return type(self).fn(x, self.kernel_size, self.stride, self.padding, self.dilation,
                             self.ceil_mode, self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"
                f", dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class MaxPool1d(_MaxPoolNd):
    fn = F.max_pool1d


class MaxPool2d(_MaxPoolNd):
    fn = F.max_pool2d


class AvgPool1d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True) -> None:
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride if stride is not None \
            else kernel_size
        self.padding, self.ceil_mode = padding, ceil_mode
        self.count_include_pad = count_include_pad

    def forward(self, x):
        return F.avg_pool1d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(AvgPool1d):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None) -> None:
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad)
        self.divisor_override = divisor_override

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)


class AdaptiveAvgPool1d(Module):
    def __init__(self, output_size) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return F.adaptive_avg_pool1d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveAvgPool2d(AdaptiveAvgPool1d):
    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)
