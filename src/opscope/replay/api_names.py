"""Which API-level calls replay may run: a deny-by-default allow-list of pure math functions.

API-level records (opscope's ``level="api"``, msprobe's ``Functional.`` / ``Torch.`` /
``Tensor.`` entries) name a Python function. A name read from a dump never becomes an
attribute lookup by itself: :func:`resolve_api` looks the name up in the tables below, and
only a listed name is fetched, from its one namespace (``torch.nn.functional``, ``torch``
or ``torch.Tensor``). Anything else (``torch.load``, ``Functional.__import__``,
``Tensor.__reduce_ex__``, a name with a dot too many) is refused without being called.

Listed: functions whose result depends on their tensor and number arguments only, with no
side effect (no file, no global state, no random numbers, no writes into their inputs).
Random functions and in-place methods are named apart, with the reason replay gives.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from opscope.errors import ReplayError
from opscope.model.calls import in_place

_MATH = """
abs absolute acos acosh add addbmm addcdiv addcmul addmm addmv addr all allclose amax amin any argmax argmin
argsort asin asinh atan atan2 atanh baddbmm bmm broadcast_to cat ceil chunk clamp clamp_max clamp_min clip
concat concatenate cos cosh cummax cummin cumprod cumsum deg2rad diag diagonal diff dist div divide dot
einsum eq erf erfc erfinv exp exp2 expm1 flatten flip fliplr flipud float_power floor floor_divide fmax
fmin fmod frac gather ge greater greater_equal gt heaviside hypot index_select inner isclose isfinite isinf
isnan kron le lerp less less_equal lgamma log log10 log1p log2 logaddexp logaddexp2 logcumsumexp
logical_and logical_not logical_or logical_xor logit logsumexp lt masked_fill masked_select matmul max
maximum mean median min minimum mm moveaxis movedim mul multiply mv nan_to_num nanmean nansum narrow ne
neg negative norm not_equal outer permute pow prod rad2deg reciprocal remainder repeat_interleave reshape
roll rot90 round rsqrt rsub select sgn sigmoid sign signbit sin sinc sinh softmax sort split sqrt square
squeeze stack std sub subtract sum swapaxes swapdims t take take_along_dim tan tanh tensordot tile topk
trace transpose tril triu true_divide trunc unbind unflatten unsqueeze var vstack hstack dstack where
xlogy zeros_like ones_like full_like log_softmax relu cdist cosine_similarity layer_norm group_norm
native_layer_norm embedding conv1d conv2d conv3d zeros ones full arange linspace eye
"""

# torch.<name>
TORCH = frozenset(_MATH.split())

# torch.nn.functional.<name>
FUNCTIONAL = frozenset("""
linear bilinear conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d relu relu6 elu selu
celu gelu silu mish leaky_relu hardtanh hardswish hardsigmoid sigmoid tanh softplus softsign softmax softmin
log_softmax glu logsigmoid tanhshrink softshrink hardshrink threshold prelu layer_norm group_norm rms_norm
batch_norm instance_norm local_response_norm normalize embedding one_hot pad interpolate avg_pool1d
avg_pool2d avg_pool3d max_pool1d max_pool2d max_pool3d adaptive_avg_pool1d adaptive_avg_pool2d
adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d cross_entropy nll_loss mse_loss l1_loss
smooth_l1_loss huber_loss binary_cross_entropy binary_cross_entropy_with_logits kl_div cosine_similarity
pairwise_distance scaled_dot_product_attention pixel_shuffle pixel_unshuffle unfold fold
""".split())

# torch.Tensor.<name> (called with the recorded ``self`` first); Python operators included
TENSOR = frozenset(set(_MATH.split()) | set("""
view view_as reshape_as contiguous clone float double half bfloat16 int long bool to type_as expand
expand_as repeat softmax log_softmax relu sum mean __add__ __radd__ __sub__ __rsub__ __mul__ __rmul__
__truediv__ __rtruediv__ __floordiv__ __rfloordiv__ __mod__ __rmod__ __matmul__ __rmatmul__ __pow__
__rpow__ __neg__ __pos__ __abs__ __and__ __or__ __xor__ __rand__ __ror__ __rxor__ __invert__ __lt__
__le__ __gt__ __ge__ __eq__ __ne__ __getitem__ positive chunk split unflatten new_zeros new_ones
new_full masked_fill index_select gather
""".split()))

NAMESPACES: dict[str, tuple[frozenset[str], Callable[[], Any]]] = {
    "torch.nn.functional.": (FUNCTIONAL, lambda: __import__("torch").nn.functional),
    "Tensor.": (TENSOR, lambda: __import__("torch").Tensor),
    "torch.": (TORCH, lambda: __import__("torch")),
}

# random: they draw from a generator whose state an API-level dump does not record
RANDOM = frozenset("""
dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout gumbel_softmax rrelu bernoulli
multinomial normal poisson rand rand_like randint randint_like randn randn_like randperm uniform_
normal_ bernoulli_ exponential_ geometric_ log_normal_ cauchy_ random_
""".split())

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def split_name(name: str) -> tuple[str, str] | None:
    """``(namespace prefix, function)`` of an API-level name, or None for another kind."""
    for prefix in NAMESPACES:
        if name.startswith(prefix):
            rest = name[len(prefix):]
            return (prefix, rest) if _NAME.match(rest) else None
    return None




def why_not(name: str) -> str | None:
    """Why replay refuses the API call ``name``, or None when it is on the allow-list."""
    parts = split_name(name)
    if parts is None:
        return (f"{name!r} is not a torch, torch.nn.functional or Tensor call opscope replays (replay runs "
                "aten ops, the API calls on its allow-list and MindSpore's common op types)")
    prefix, func = parts
    if func in RANDOM:
        return (f"{name} is random: it draws from a generator whose state an API-level dump does not record, "
                "so its numbers cannot be drawn again (dump with level=\"aten\" to replay random ops)")
    if in_place(func):
        return (f"{name} writes into its input in place: whether a dump holds that input as it was before or "
                "after the write depends on the tool and its version (msprobe hashes inputs on a thread; opscope's "
                "api level recorded them after the write until recently), so replay does not "
                "re-run in-place calls; the out-of-place calls around it replay")
    allowed, _ = NAMESPACES[prefix]
    if func not in allowed:
        return (f"{name} is not on replay's allow-list of pure math functions (opscope/replay/api_names.py; "
                "names from a dump are never looked up outside it); register a golden implementation with "
                f"opscope.replay.register_replay({name!r})")
    return None


def resolve_api(name: str) -> Callable[..., Any]:
    """The torch function for an allowed API name; a ReplayError naming the reason otherwise."""
    reason = why_not(name)
    if reason is not None:
        raise ReplayError(f"not replayable: {reason}")
    prefix, func = split_name(name) or ("", "")  # why_not() checked it
    allowed, namespace = NAMESPACES[prefix]
    member = next(n for n in allowed if n == func)  # the table's own string, not the dump's
    found = getattr(namespace(), member, None)
    if not callable(found):
        raise ReplayError(f"not replayable: {name} does not exist in this torch ({__import__('torch').__version__})")
    return found
