"""Write docs/torch-coverage.md: which public names of torch the engine provides.

    python tests/torch_coverage.py            # regenerate docs/torch-coverage.md (needs torch)
    python tests/torch_coverage.py --check    # exit 1 if a name is unassigned or the page is stale
    python tests/torch_coverage.py --unassigned   # list the names no rule places

Every public name (no leading underscore) of `torch`, `torch.Tensor`, `torch.nn`,
`torch.nn.functional`, `torch.optim` and `torch.utils.data` is either provided by the
engine's matching namespace (`tinygrad_attn`, a Tensor, `nn`, `nn.functional`, `nn.optim`,
`tinygrad_attn.utils.data`), or placed by name pattern in one out-of-scope GROUP with its
reason, or listed by name in GAPS: what the engine does not implement yet. A name in none of
them fails tests/test_namespace.py, so a new torch name is placed on purpose.

The page is generated in a fresh interpreter (dir(torch) grows as torch's submodules are
imported), so run this script as a command, not from inside another program.
"""

from __future__ import annotations

import difflib
import fnmatch
import pathlib
import sys
import warnings

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "torch-coverage.md"

NAMESPACES = ("torch", "torch.Tensor", "torch.nn", "torch.nn.functional", "torch.optim",
              "torch.utils.data")

# (group, reason, the namespaces it applies to ("*": all), fnmatch patterns). The first
# group whose patterns match a name that the engine does not provide takes it.
GROUPS = [
    ("python and typing names", "modules and typing helpers torch's own module imports or "
     "defines for itself (not API)", "*",
     "builtins ctypes functools glob importlib inspect math os platform sys textwrap threading "
     "warnings typing types dataclasses np torch TYPE_CHECKING Callable Optional "
     "USE_GLOBAL_DEPS USE_RTLD_GLOBAL_WITH_LIBTORCH PRIVATE_OPS classproperty typename "
     "BroadcastingList? DType ScalingType SwizzleType GRID_SAMPLE_* assert_int_or_pair "
     "boolean_dispatch handle_torch_function has_torch_function* *_notes Tensor "
     "common_types factory_kwargs"),
    ("TorchScript, FX, export and compiler internals", "torch's graph capture and compilers; "
     "the engine runs eagerly (ta.compile returns the model unchanged)", "*",
     "jit fx export compiler library classes package cpp hub overrides fork wait cond "
     "while_loop vmap sym_* Sym* AliasDb *Type ArgumentSpec CompleteArgumentSpec Argument "
     "Block Node Value Use Graph GraphExecutorState Gradient Code CallStack Capsule "
     "CompilationUnit ConcreteModuleType* DeepCopyMemoTable ErrorReport ExecutionPlan "
     "FileCheck FunctionSchema Future IODescriptor JITException LiteScriptModule "
     "OperatorInfo Script* StaticModule TracingState Tag DispatchKey* "
     "ExcludeDispatchKeyGuard DisableTorchFunction* import_ir_module* parse_ir parse_schema "
     "parse_type_comment merge_type_from_type_comment unify_type_list AggregationType AVG SUM "
     "LockingLogger LoggerBase NoopLogger ThroughputBenchmark BenchmarkConfig "
     "BenchmarkExecutionStats monitor PyTorchFileReader PyTorchFileWriter "
     "*SerializationStorageContext ScriptModuleSerializer compiled_with_cxx11_abi "
     "torch_version version testing get_file_path prepare_multiprocessing_environment "
     "init_num_threads profiler profiler_allow_* BufferDict functorch FatalError futures"),
    ("storages and legacy typed tensors", "the engine's Storage is its own (ta.Storage); "
     "make tensors with ta.tensor(..., dtype=...) rather than torch.FloatTensor(...)", "*",
     "*Storage StorageBase *Tensor is_storage from_file frombuffer storage_type "
     "DeserializationStorageContext new resize set_ is_set_to const_data_ptr"),
    ("quantization", "quantized dtypes and kernels are out of scope (the engine computes in "
     "float16/32/64 and integer dtypes)", "*",
     "q_* qint* quint* qscheme quantize* *quantized* dequantize fake_quantize* fbgemm* "
     "per_channel* per_tensor* int_repr choose_qparams_optimized fused_moving_avg_obs_fake_quant "
     "quantization ao intrinsic qat quantizable is_quantized"),
    ("sparse tensors", "every engine tensor is dense and strided", "*",
     "sparse* *_sparse* to_sparse* Sparse* to_dense coalesce is_coalesced dense_dim "
     "sparse_dim smm hsmm dsmm spmm sspaddmm saddmm hspmm indices values crow_indices "
     "col_indices ccol_indices row_indices *indices_copy values_copy sparse_mask is_sparse*"),
    ("complex numbers", "the engine's dtypes are real (docs/differences.md, dtypes)", "*",
     "complex* cfloat cdouble chalf angle conj* imag real polar view_as_complex* "
     "view_as_real* resolve_conj resolve_neg is_conj is_neg adjoint H mH"),
    ("dtypes the engine lacks", "bfloat16 exists as a name only; sub-byte, float8, unsigned "
     "wide and bit dtypes do not (docs/differences.md, dtypes)", "*",
     "bit bits* int1 int2 int3 int4 int5 int6 int7 uint1 uint2 uint3 uint4 uint5 uint6 uint7 "
     "uint16 uint32 uint64 float8_* float4_*"),
    ("FFT and signal processing", "spectral ops are out of scope", "*",
     "fft stft istft signal windows *_window has_spectral"),
    ("linear-algebra decompositions and solvers", "the engine's linear algebra is matmul, "
     "einsum and norms (ta.linalg); decompositions and solvers are out of scope", "*",
     "cholesky* det eig geqrf inverse logdet lstsq lu lu_* matrix_exp matrix_power "
     "matrix_rank orgqr ormqr pinverse qr slogdet solve svd svd_lowrank symeig "
     "triangular_solve lobpcg pca_lowrank nuclear_norm frobenius_norm has_lapack"),
    ("special functions", "gamma-family and Bessel functions are out of scope", "*",
     "digamma* polygamma* lgamma* mvlgamma* igamma* igammac* i0 i0_ special"),
    ("multiprocessing and single-process multi-device", "shared-memory tensors, "
     "multi-process data loading and DataParallel are not implemented (data-parallel "
     "training is ta.distributed on MPI and nn.parallel.DistributedDataParallel: "
     "docs/distributed.md)", "*",
     "multiprocessing is_distributed DataParallel SyncBatchNorm "
     "share_memory_ is_shared get_worker_info"),
    ("device kernels other than CPU and CUDA-through-CuPy", "cuDNN, MIOpen, oneDNN, MPS, XPU, "
     "MTIA, Vulkan, XLA, IPU and streams/events: the engine runs NumPy on the CPU and CuPy on "
     "a GPU", "*",
     "cudnn_* miopen_* mkldnn* to_mkldnn mps xpu is_xpu mtia is_mtia ipu is_ipu is_maia "
     "is_mps is_vulkan is_vulkan_available is_xla is_mkldnn Stream Event AcceleratorError "
     "record_stream pin_memory is_pinned grouped_mm scaled_grouped_mm scaled_mm has_mkl "
     "has_openmp set_flush_denormal attention"),
    ("autocast internals", "the engine has no autocast (ta.amp, docs/differences.md)", "*",
     "autocast_* get_autocast_* set_autocast_* is_autocast_* clear_autocast_cache"),
    ("nested and jagged tensors", "out of scope", "*",
     "nested jagged to_padded_tensor is_nested"),
    ("layouts and memory formats", "every engine tensor is strided; there is no channels_last",
     "*",
     "channels_last* contiguous_format preserve_format legacy_contiguous_format memory_format "
     "layout strided dim_order"),
    ("aten-level kernels and _copy variants", "torch's internal kernels exposed under torch.* "
     "(native_*, *_copy, unsafe_*); the engine's public ops cover their use", "torch",
     "native_* *_backward* batch_norm_* conv_tbc convolution constant_pad_nd grid_sampler* "
     "affine_grid_generator embedding_renorm_ rnn_relu* rnn_tanh* lstm lstm_cell gru "
     "gru_cell segment_reduce norm_except_dim *_copy unsafe_* slice_inverse hash_tensor "
     "thread_safe_generator"),
    ("Tensor internals and legacy attributes", "Python-callback fills, named tensors and "
     "attributes kept for backward compatibility", "torch.Tensor",
     "apply_ map_ map2_ reinforce volatile module_load output_nr name as_subclass grad_dtype "
     "unsafe_* slice_inverse hash_tensor narrow_copy"),
    ("lazy modules", "modules whose shapes are inferred at the first call; give the sizes",
     "torch.nn", "Lazy* Uninitialized*"),
    ("deprecated in torch", "kept by torch for old code: nn.Container (use Module), "
     "F.upsample* (use interpolate)", "torch.nn torch.nn.functional",
     "Container upsample upsample_bilinear upsample_nearest"),
    ("DataPipes", "torch.utils.data's DataPipes (deprecated in torch); Dataset and "
     "DataLoader are the API", "torch.utils.data",
     "*DataPipe* datapipes DataChunk functional_datapipe guaranteed_datapipes_determinism "
     "non_deterministic runtime_validation* argument_validation graph graph_settings"),
    ("probability distributions", "torch.distributions and quasi-random sequences are not in "
     "the engine; sample with ta.multinomial, ta.normal, ta.rand", "torch",
     "distributions quasirandom"),
]

# Names the engine does not implement yet, by namespace: honest gaps, not hidden. A name
# here that the engine comes to provide moves to "provided" on the next generation.
GAPS = {
    "torch": """
        Event ModuleDict ParameterDict Size abs_ acos_ acosh_ adaptive_max_pool1d addbmm
        addmv addmv_ addr alpha_dropout alpha_dropout_ arccos_ arccosh_ arcsin_ arcsinh_
        arctan_ arctanh_ are_deterministic_algorithms_enabled argwhere as_strided_
        as_strided_scatter as_tensor asarray asin_ asinh_ atan_ atanh_ atleast_1d
        atleast_2d atleast_3d batch_norm bilinear binary_cross_entropy_with_logits
        bincount binomial block_diag broadcast_shapes broadcast_tensors bucketize
        can_cast cartesian_prod cdist ceil_ celu_ chain_matmul channel_shuffle clamp_
        clamp_max clamp_max_ clamp_min clamp_min_ clip_ column_stack combinations concat
        concatenate conv3d conv_transpose3d corrcoef cos_ cosh_ cosine_embedding_loss
        cosine_similarity cov cpu cross ctc_loss cudnn_is_acceptable
        cumulative_trapezoid deg2rad deg2rad_ detach detach_ diag_embed diagflat
        diagonal_scatter diff dist dropout dropout_ dsplit dstack embedding
        embedding_bag empty_permuted empty_strided equal erf_ erfc_ exp2_ exp_ expm1_
        feature_alpha_dropout feature_alpha_dropout_ feature_dropout feature_dropout_
        fill fill_ fix_ float_power floor_ fmax fmin frac_ frexp gcd gcd_ ger
        get_default_device get_deterministic_debug_mode get_device get_device_module
        get_num_interop_threads gradient hardshrink heaviside hinge_embedding_loss histc
        histogram histogramdd hsplit hstack index_put index_put_ index_reduce inner
        instance_norm int is_anomaly_check_nan_enabled is_anomaly_enabled
        is_deterministic_algorithms_warn_only_enabled is_inference is_same_size
        is_signed is_warn_always_enabled isin isneginf isposinf isreal kl_div kron lcm
        lcm_ ldexp ldexp_ log10_ log1p_ log2_ log_ logaddexp2 logit logit_ logspace
        margin_ranking_loss masked math max_pool1d_with_indices max_pool3d msort
        mvlgamma nan_to_num_ nanquantile neg_ negative_ nextafter nonzero_static
        pairwise_distance pdist pixel_shuffle pixel_unshuffle poisson_nll_loss positive
        prelu put quantile rad2deg rad2deg_ range reciprocal_ relu_ renorm resize_as_
        result_type rot90 round_ row_stack rrelu rrelu_ rsqrt_ rsub scalar_tensor
        searchsorted select_scatter selu_ set_anomaly_enabled set_default_device
        set_default_tensor_type set_deterministic_debug_mode set_num_interop_threads
        set_printoptions set_warn_always sigmoid_ signbit sin_ sinc sinc_ sinh_
        slice_scatter split_with_sizes sqrt_ square_ tan_ tanh_ take tensor_split
        tensordot threshold threshold_ to_dlpack trace trapezoid trapz
        triplet_margin_loss trunc_ unique unique_consecutive unravel_index
        use_deterministic_algorithms vander vdot vsplit vstack xlogy xlogy_ zero_
        select_copy
    """,
    "torch.Tensor": """
        addbmm addbmm_ addmv addmv_ addr addr_ argwhere as_strided_ as_strided_scatter
        bfloat16 bincount clamp_max clamp_max_ clamp_min clamp_min_ corrcoef cov cross
        deg2rad deg2rad_ diag_embed diagflat diagonal_scatter diff dist dsplit equal
        fill_diagonal_ float_power float_power_ fmax fmin frexp gcd gcd_ ger hardshrink
        heaviside heaviside_ histc histogram hsplit index index_put index_put_
        index_reduce index_reduce_ inner is_inference is_meta is_same_size is_signed
        isneginf isposinf isreal kron lcm lcm_ ldexp ldexp_ logaddexp2 logit logit_
        msort nanquantile new_empty_strided nextafter nextafter_ nonzero_static positive
        prelu put put_ quantile rad2deg rad2deg_
        renorm renorm_ resize_ resize_as resize_as_ rot90 select_scatter signbit sinc
        sinc_ slice_scatter split_with_sizes squeeze_ sum_to_size swapaxes_ swapdims_ t_
        take tensor_split trace transpose_ unique unique_consecutive unsqueeze_ vdot
        vsplit xlogy xlogy_
    """,
    "torch.nn": """
        AdaptiveAvgPool3d AdaptiveLogSoftmaxWithLoss AdaptiveMaxPool1d AdaptiveMaxPool2d
        AdaptiveMaxPool3d AlphaDropout AvgPool3d BatchNorm3d Bilinear Buffer CTCLoss
        ChannelShuffle CircularPad1d CircularPad2d CircularPad3d ConstantPad1d
        ConstantPad2d ConstantPad3d Conv3d ConvTranspose3d CosineEmbeddingLoss
        CosineSimilarity CrossMapLRN2d Dropout1d Dropout2d Dropout3d EmbeddingBag
        FeatureAlphaDropout Fold FractionalMaxPool2d FractionalMaxPool3d GaussianNLLLoss
        Hardshrink HingeEmbeddingLoss InstanceNorm1d InstanceNorm2d InstanceNorm3d
        LPPool1d LPPool2d LPPool3d LinearCrossEntropyLoss LinearCrossEntropyOptions
        LocalResponseNorm MarginRankingLoss MaxPool3d MaxUnpool1d MaxUnpool2d
        MaxUnpool3d MultiLabelMarginLoss MultiLabelSoftMarginLoss MultiMarginLoss
        NLLLoss2d PReLU PairwiseDistance ParameterDict ParameterList PixelShuffle
        PixelUnshuffle PoissonNLLLoss RReLU ReflectionPad1d ReflectionPad2d
        ReflectionPad3d ReplicationPad1d ReplicationPad2d ReplicationPad3d
        SoftMarginLoss Softmax2d Softshrink Tanhshrink Threshold TripletMarginLoss
        TripletMarginWithDistanceLoss Unfold Upsample UpsamplingBilinear2d
        UpsamplingNearest2d ZeroPad1d ZeroPad2d ZeroPad3d grad parameter
    """,
    "torch.nn.functional": """
        adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool1d_with_indices
        adaptive_max_pool2d adaptive_max_pool2d_with_indices adaptive_max_pool3d
        adaptive_max_pool3d_with_indices affine_grid alpha_dropout avg_pool3d bilinear
        celu_ channel_shuffle conv3d conv_tbc conv_transpose3d cosine_embedding_loss
        cosine_similarity ctc_loss dropout1d dropout2d dropout3d elu_ embedding_bag
        feature_alpha_dropout fold fractional_max_pool2d
        fractional_max_pool2d_with_indices fractional_max_pool3d
        fractional_max_pool3d_with_indices gaussian_nll_loss grad grid_sample
        gumbel_softmax hardshrink hardtanh_ hinge_embedding_loss instance_norm
        interpolate leaky_relu_ linear_cross_entropy local_response_norm lp_pool1d
        lp_pool2d lp_pool3d margin_ranking_loss max_pool1d_with_indices
        max_pool2d_with_indices max_pool3d max_pool3d_with_indices max_unpool1d
        max_unpool2d max_unpool3d multi_margin_loss multilabel_margin_loss
        multilabel_soft_margin_loss native_channel_shuffle pairwise_distance pdist
        pixel_shuffle pixel_unshuffle poisson_nll_loss prelu relu_ rrelu rrelu_ selu_
        soft_margin_loss softshrink tanhshrink threshold threshold_ triplet_margin_loss
        triplet_margin_with_distance_loss unfold
    """,
    "torch.optim": """
        Adafactor LBFGS Muon SparseAdam swa_utils swap_in_optimizer_params_and_state
    """,
    "torch.utils.data": """""",
}


def _public(obj) -> list[str]:
    return sorted(n for n in dir(obj) if not n.startswith("_"))


def _has(obj, name: str) -> bool:
    """Whether `obj.name` exists (a property that raises for this object still exists)."""
    if obj is None:
        return False
    try:
        getattr(obj, name)
    except AttributeError:
        return False
    except Exception:  # noqa: BLE001 - the attribute is there, it refused this instance
        return True
    return True


def _namespaces():
    """{label: (torch object, the engine's object or None)}."""
    warnings.simplefilter("ignore")
    import torch
    import torch.nn.functional
    import torch.optim
    import torch.utils.data

    sys.path.insert(0, str(ROOT))
    import nn
    import tinygrad_attn as ta

    utils = getattr(ta, "utils", None) if _has(ta, "utils") else None
    data = getattr(utils, "data", None) if _has(utils, "data") else None
    return torch.__version__, {
        "torch": (torch, ta),
        "torch.Tensor": (torch.Tensor, ta.zeros(2, 2, requires_grad=True)),
        "torch.nn": (torch.nn, nn),
        "torch.nn.functional": (torch.nn.functional, nn.functional),
        "torch.optim": (torch.optim, nn.optim),
        "torch.utils.data": (torch.utils.data, data),
    }


def _group_of(label: str, name: str):
    for group, _reason, where, patterns in GROUPS:
        if where != "*" and label not in where.split():
            continue
        if any(fnmatch.fnmatchcase(name, p) for p in patterns.split()):
            return group
    return None


def classify():
    """(torch version, {label: {"provided": [...], "groups": {group: [...]}, "gaps": [...],
    "unassigned": [...]}})."""
    version, spaces = _namespaces()
    out = {}
    for label in NAMESPACES:
        theirs, ours = spaces[label]
        gaps = set(GAPS.get(label, "").split())
        names = _public(theirs)
        row = {"provided": [], "groups": {g[0]: [] for g in GROUPS}, "gaps": [],
               "unassigned": [], "not_in_torch": sorted(gaps - set(names)),
               "stale_gaps": sorted(n for n in gaps & set(names) if _has(ours, n))}
        for name in names:
            if _has(ours, name):
                row["provided"].append(name)
            elif name in gaps:
                row["gaps"].append(name)
            elif (group := _group_of(label, name)) is not None:
                row["groups"][group].append(name)
            else:
                row["unassigned"].append(name)
        out[label] = row
    return version, out


def _names(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def render(version: str, table: dict) -> str:
    reasons = {g[0]: g[1] for g in GROUPS}
    lines = [
        "# Coverage of torch's public names",
        "",
        "Which public names of `torch`, `torch.Tensor`, `torch.nn`, `torch.nn.functional`, "
        "`torch.optim` and `torch.utils.data` the engine provides (as `tinygrad_attn.X`, "
        "a Tensor's attribute, `nn.X`, `nn.functional.X`, `nn.optim.X` and "
        "`tinygrad_attn.utils.data.X`), which are out of scope and why, and which are not "
        "implemented yet. Provided means the name exists there; what it computes is checked "
        "against torch by the conformance tests, and deliberate differences are in "
        "[differences.md](differences.md).",
        "",
        f"Generated by `python tests/torch_coverage.py` from torch {version}; "
        "tests/test_namespace.py checks that it is current. Do not edit by hand.",
        "",
        "| namespace | torch names | provided | out of scope | not implemented yet |",
        "|---|---:|---:|---:|---:|",
    ]
    for label in NAMESPACES:
        row = table[label]
        scope = sum(len(v) for v in row["groups"].values())
        total = len(row["provided"]) + scope + len(row["gaps"]) + len(row["unassigned"])
        lines.append(f"| `{label}` | {total} | {len(row['provided'])} | {scope} | "
                     f"{len(row['gaps'])} |")
    for label in NAMESPACES:
        row = table[label]
        lines += ["", f"## `{label}`", "", f"**Provided** ({len(row['provided'])}): "
                  f"{_names(row['provided'])}", ""]
        for group, names in row["groups"].items():
            if names:
                lines.append(f"- **{group}** ({len(names)}; {reasons[group]}): "
                             f"{_names(names)}")
        lines += ["", f"**Not implemented yet** ({len(row['gaps'])}): {_names(row['gaps'])}"]
        if row["unassigned"]:
            lines += ["", f"**Unassigned** ({len(row['unassigned'])}; add each to a group or "
                      f"to GAPS in tests/torch_coverage.py): {_names(row['unassigned'])}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    version, table = classify()
    unassigned = {k: v["unassigned"] for k, v in table.items() if v["unassigned"]}
    if "--unassigned" in argv:
        for label, names in unassigned.items():
            print(f"{label}: {' '.join(names)}")
        return 1 if unassigned else 0
    text = render(version, table)
    if "--check" in argv:
        problems = [f"{label}: {len(names)} torch names in no group and not in GAPS: "
                    f"{' '.join(names)}" for label, names in unassigned.items()]
        problems += [f"{label}: GAPS names that torch {version} does not have: "
                     f"{' '.join(row['not_in_torch'])}"
                     for label, row in table.items() if row["not_in_torch"]]
        problems += [f"{label}: GAPS names the engine now provides (remove them from GAPS): "
                     f"{' '.join(row['stale_gaps'])}"
                     for label, row in table.items() if row["stale_gaps"]]
        old = PAGE.read_text() if PAGE.exists() else ""
        if old != text:
            changed = [line[:160] for line in difflib.unified_diff(
                old.splitlines(), text.splitlines(), "committed", "now", n=0, lineterm="")]
            problems.append(f"{PAGE.relative_to(ROOT)} is not what the script generates now; "
                            "run: python tests/torch_coverage.py\n" + "\n".join(changed[:12]))
        print("\n".join(problems) or "torch coverage: every name placed, page current")
        return 1 if problems else 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}" + (f" ({sum(map(len, unassigned.values()))} "
                                                 "names unassigned)" if unassigned else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
