"""torch.nn.modules.module: its classes, read from nn on first use."""

from ._lazy import lazy_names

NAMES = (
    "Module", "register_module_backward_hook", "register_module_buffer_registration_hook",
    "register_module_forward_hook", "register_module_forward_pre_hook",
    "register_module_full_backward_hook", "register_module_full_backward_pre_hook",
    "register_module_module_registration_hook", "register_module_parameter_registration_hook",
)
__getattr__, __dir__ = lazy_names(__name__, NAMES)
