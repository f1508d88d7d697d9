#!/usr/bin/env python3
"""The ComfyUI adapter: an external predictor for vramfuzz (protocol vramfuzz.predictor/1,
docs/predictor-protocol.md) that runs the REAL ComfyUI planner, not vramfuzz's emulation of it.

    python comfyui_predictor.py --comfyui /path/to/ComfyUI      (or COMFYUI_PATH=/path/to/ComfyUI)

For every request it
  * fakes a CUDA device from the request's `view` (torch.cuda.mem_get_info, memory_stats,
    device properties, allocator backend), so that ComfyUI's get_free_memory() takes its CUDA
    branch; the free memory it reports shrinks by the bytes of every module ComfyUI has moved
    to the device (weights are meta tensors: nothing is allocated);
  * builds each model of the scenario on the meta device from ComfyUI's own op classes
    (comfy.ops.pick_operations -> manual_cast / disable_weight_init Linear, Conv, norms,
    Embedding), one module per request module with the request's tensors, shapes and dtypes;
    `cast_hook: false` modules are plain torch modules (no comfy_cast_weights), containers too;
  * wraps each in a real comfy.model_patcher.ModelPatcher (load device `meta:0`, offload
    device `meta`: two distinct devices, so `Module.to()` calls tell where a module went);
  * runs the real comfy.model_management.load_models_gpu for each `load` stage in pipeline order
    (with the memory_required ComfyUI's sampler / VAE / CLIP pass), the real free_memory for
    `unload` stages, and reads back ComfyUI's state: which modules it moved to the device,
    which it marked to cast on the fly, its offload buffer, its log line, evictions.

Only protocol lines go to stdout; ComfyUI's logging and everything else goes to stderr.
"""
import argparse
import json
import logging
import math
import os
import re
import subprocess
import sys
import time
import types

MIB = 1 << 20
GIB = 1 << 30

# The two devices the patchers use. Both are the meta device (tensors never hold data); their
# indices differ so that ComfyUI's Module.to(device) calls tell load from offload.
LOAD_DEVICE_SPEC = ("meta", 0)
OFFLOAD_DEVICE_SPEC = ("meta",)
# vramfuzz's policy overrides this adapter turns into ComfyUI settings (its hello's
# supports.overrides): reserve is --reserve-vram (EXTRA_RESERVED_VRAM), num_streams is
# --async-offload N (NUM_STREAMS).
APPLIED_OVERRIDES = ("reserve", "num_streams")

log = logging.getLogger("vramfuzz.comfyui")


# --------------------------------------------------------------------------------------------
# stdout discipline: the protocol owns the real stdout; anything ComfyUI prints goes to stderr.
# --------------------------------------------------------------------------------------------
def take_stdout():
    proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


# --------------------------------------------------------------------------------------------
# The fake device
# --------------------------------------------------------------------------------------------
class FakeDevice:
    """What torch.cuda reports: the request's view, less the weights ComfyUI put on the device."""

    def __init__(self):
        self.set_view({"total": 12 * GIB, "free": 12 * GIB, "torch_reserved": 0, "torch_active": 0,
                       "allocator_backend": "native"})
        self.on_device = lambda: 0  # bytes of module tensors on the load device

    def set_view(self, view):
        self.total = int(view["total"])
        self.free = int(view["free"])
        self.reserved = int(view.get("torch_reserved", 0))
        self.active = int(view.get("torch_active", 0))
        backend = view.get("allocator_backend", "native")
        # `raw` is PYTORCH_NO_CUDA_MEMORY_CACHING=1: torch still calls its backend "native".
        self.backend = "cudaMallocAsync" if backend == "cudaMallocAsync" else "native"

    # A weight moved to the device is a torch allocation: the driver's free memory shrinks and
    # torch's reserved and active bytes grow by it (no allocator rounding is modelled here).
    def mem_get_info(self, device=None):
        return (max(0, self.free - self.on_device()), self.total)

    def memory_stats(self, device=None):
        w = self.on_device()
        return {"reserved_bytes.all.current": self.reserved + w, "active_bytes.all.current": self.active + w,
                "allocated_bytes.all.current": self.active + w, "reserved_bytes.all.peak": self.reserved + w,
                "active_bytes.all.peak": self.active + w, "allocated_bytes.all.peak": self.active + w,
                "num_ooms": 0, "num_alloc_retries": 0}

    def properties(self, device=None):
        return types.SimpleNamespace(name="NVIDIA GeForce RTX 3060 (vramfuzz view)", major=8, minor=6,
                                     total_memory=self.total, multi_processor_count=28, is_integrated=False,
                                     gcnArchName="", uuid="vramfuzz", L2_cache_size=3 << 20)


def install_fake_cuda(torch, dev):
    c = torch.cuda
    c.is_available = lambda: True
    c.device_count = lambda: 1
    c.current_device = lambda: 0
    c.set_device = lambda d: None
    c.mem_get_info = dev.mem_get_info
    c.memory_stats = dev.memory_stats
    c.memory_reserved = lambda d=None: dev.memory_stats()["reserved_bytes.all.current"]
    c.memory_allocated = lambda d=None: dev.memory_stats()["allocated_bytes.all.current"]
    c.max_memory_allocated = c.memory_allocated
    c.max_memory_reserved = c.memory_reserved
    c.get_device_properties = dev.properties
    c.get_device_name = lambda d=None: dev.properties().name
    c.get_device_capability = lambda d=None: (8, 6)
    c.get_allocator_backend = lambda: dev.backend
    c.is_bf16_supported = lambda *a, **k: True
    c.synchronize = lambda d=None: None
    c.empty_cache = lambda: None
    c.ipc_collect = lambda: None
    c.reset_peak_memory_stats = lambda d=None: None
    c.init = lambda: None
    c.is_initialized = lambda: True


# --------------------------------------------------------------------------------------------
# comfy-aimdo, for a dynamic VRAM runtime
# --------------------------------------------------------------------------------------------
DYNAMIC_RUNTIMES = ("comfy:sep2026",)
VBAR_PAGE = 32 << 20  # aimdo's VBAR_PAGE_SIZE


def install_fake_aimdo(dev):
    """comfy-aimdo without a device: its VBAR and host buffers as objects that hold nothing.

    ModelPatcherDynamic.load asks the VBAR for one slice per staged module; the slices are placed
    by aimdo's own Python ModelVBAR.alloc (512-byte aligned, in call order, MemoryError past the
    reservation), run unchanged on an object with no native VBAR behind it. Nothing is faulted at
    plan time, so loaded_size() and what free_memory() can free are 0, as for a VBAR that has not
    run a forward. Host buffers (pinned RAM) are RAM, not VRAM: empty."""
    import comfy_aimdo.host_buffer as hb
    import comfy_aimdo.model_vbar as mv

    real_alloc = mv.ModelVBAR.alloc

    class PlanningVBAR:
        def __init__(self, size, device):
            self.device = device
            self.max_size = int(size)
            self.offset = 0
            self.base_addr = 0

        alloc = real_alloc

        def pages(self):
            return min(-(-self.max_size // VBAR_PAGE), dev.total // VBAR_PAGE)

        def prioritize(self, malloc_async_clamp=None):
            pass

        def deprioritize(self):
            pass

        def loaded_size(self):
            return 0

        def free_memory(self, size_bytes):
            return 0

        def unpin(self, alloc, size):
            pass

        def set_watermark_limit(self, size_bytes):
            pass

        def set_watermark(self, size_bytes):
            pass

        def get_nr_pages(self):
            return self.pages()

        def get_watermark(self):
            return 0

        def get_residency(self):
            return [0] * self.pages()

    class PlanningHostBuffer:
        def __init__(self, size=0, prewarm=0, max_grow_size=0, mark_cold=True):
            self.size = 0
            self.prewarm = int(prewarm)

        def get_raw_address(self):
            return 0

        def extend(self, size, reallocate=False, register=True):
            self.size += int(size)
            return 0

        def register(self, offset, size):
            pass

        def unregister(self, offset):
            pass

        def truncate(self, size, do_unregister=True):
            self.size = int(size)

    mv.ModelVBAR = PlanningVBAR
    mv.vbar_unpin = lambda alloc: None
    mv.vbars_analyze = lambda device=None: 0
    mv.vbars_reset_watermark_limits = lambda: None
    hb.HostBuffer = PlanningHostBuffer


# --------------------------------------------------------------------------------------------
# dtypes and sizes (vramfuzz's storage rules, harness/core/dtype.cpp)
# --------------------------------------------------------------------------------------------
GGUF_BLOCKS = {"q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q8_0": (32, 34),
               "q2_k": (256, 84), "q3_k": (256, 110), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210)}
DTYPE_ALIASES = {"float32": "fp32", "f32": "fp32", "float16": "fp16", "f16": "fp16", "half": "fp16",
                 "bfloat16": "bf16", "f8_e4m3": "fp8_e4m3fn", "float8_e4m3fn": "fp8_e4m3fn", "f8_e5m2": "fp8_e5m2",
                 "float8_e5m2": "fp8_e5m2", "i8": "int8"}


def canon_dtype(name):
    n = name.lower()
    return DTYPE_ALIASES.get(n, n)


def torch_dtype(torch, name):
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp8_e4m3fn": torch.float8_e4m3fn,
            "fp8_e5m2": torch.float8_e5m2, "int8": torch.int8}.get(name)


def expand(modules):
    """The request writes runs of equal modules NAME.0 ... NAME.k-1 once, with "repeat": k."""
    for m in modules:
        n = m.get("repeat")
        if n is None:
            yield m
        else:
            for i in range(n):
                yield dict(m, name=f"{m['name']}.{i}", repeat=None)


class Unsupported(Exception):
    """A case this adapter cannot build: answered with an `error` reply."""


# --------------------------------------------------------------------------------------------
# The adapter
# --------------------------------------------------------------------------------------------
class ComfyAdapter:
    def __init__(self, comfy_path, runtime):
        self.comfy_path = os.path.abspath(comfy_path)
        self.runtime = runtime
        if not os.path.isfile(os.path.join(self.comfy_path, "comfy", "model_management.py")):
            raise SystemExit(f"comfyui_predictor: {self.comfy_path} is not a ComfyUI checkout "
                             "(no comfy/model_management.py); give --comfyui PATH or COMFYUI_PATH")
        sys.path.insert(0, self.comfy_path)
        # ComfyUI's own command line: no pinned host memory (pinning needs a real CUDA host
        # allocator; it is RAM, not VRAM); the classic (estimate-based) planner unless the runtime
        # is dynamic VRAM, which main.py turns on once comfy-aimdo initialised (below).
        self.dynamic = runtime in DYNAMIC_RUNTIMES
        argv = ["--disable-pinned-memory"] + ([] if self.dynamic else ["--disable-dynamic-vram"])
        import torch
        self.torch = torch
        self.dev = FakeDevice()
        install_fake_cuda(torch, self.dev)
        import comfy.options
        comfy.options.enable_args_parsing(True)
        saved_argv = sys.argv
        sys.argv = [os.path.join(self.comfy_path, "main.py")] + argv
        try:
            import comfy.cli_args  # parses sys.argv once, at import
        finally:
            sys.argv = saved_argv
        self.capture = LogCapture()
        root = logging.getLogger()
        root.addHandler(self.capture)
        import comfy.model_management as mm
        import comfy.model_patcher
        import comfy.ops
        import comfy.model_base
        import comfy.sampler_helpers
        self.mm = mm
        self.ops = comfy.ops
        self.model_base = comfy.model_base
        self.sampler_helpers = comfy.sampler_helpers
        try:
            import comfy.sd
            self.vae_kl_mem_ratio = getattr(comfy.sd, "VAE_KL_MEM_RATIO", 1.0)
        except Exception as e:  # comfy.sd pulls many imports; the ratio is 1.0 except on AMD
            log.warning("comfy.sd did not import (%r): VAE_KL_MEM_RATIO taken as 1.0", e)
            self.vae_kl_mem_ratio = 1.0
        self.load_device = torch.device(*LOAD_DEVICE_SPEC)
        self.offload_device = torch.device(*OFFLOAD_DEVICE_SPEC)
        self.defaults = {"EXTRA_RESERVED_VRAM": mm.EXTRA_RESERVED_VRAM, "NUM_STREAMS": mm.NUM_STREAMS}
        self.patcher_class = make_patcher_class(comfy.model_patcher.ModelPatcher)
        self.dynamic_patcher_class = None
        if self.dynamic:
            # What main.py does when comfy-aimdo initialised: ModelPatcherDynamic is the core
            # patcher and aimdo_enabled switches the op classes and free-memory queries over.
            import comfy.memory_management
            install_fake_aimdo(self.dev)
            comfy.memory_management.aimdo_enabled = True
            self.dynamic_patcher_class = make_patcher_class(comfy.model_patcher.ModelPatcherDynamic)
            comfy.model_patcher.CoreModelPatcher = comfy.model_patcher.ModelPatcherDynamic
        self.models = []  # the models of the current request (their patchers hold them)
        self.install_move_tracking()
        self.install_meta_weights()
        self.dev.on_device = self.bytes_on_device
        self.version = comfy_version(self.comfy_path)

    # Every Module.to(device) ComfyUI makes is recorded on the modules it moves: that, not the
    # tensors (all meta), says which modules are on the device.
    def install_move_tracking(self):
        torch = self.torch
        original = torch.nn.Module.to
        load_device = self.load_device

        def to(module, *args, **kwargs):
            device = torch._C._nn._parse_to(*args, **kwargs)[0]
            if device is not None and getattr(module, "_vf_tracked", False):
                on = device == load_device
                for sm in module.modules():
                    if hasattr(sm, "_vf_on"):
                        sm._vf_on = on
            return original(module, *args, **kwargs)

        torch.nn.Module.to = to

    # ModelPatcher.load materializes a cast module's meta parameters on the host
    # (disable_weight_init._zero_init_parameter: torch.zeros of the same shape and dtype, for
    # aimdo's lazily initialized modules) before moving it. Our weights are meta by design: for
    # our modules that step is skipped (same bytes, no planning effect; it would allocate the
    # whole model in host RAM).
    def install_meta_weights(self):
        dwi = self.ops.disable_weight_init
        original = dwi._zero_init_parameter

        def zero_init(module, name):
            if getattr(module, "_vf_tracked", False):
                return None
            return original(module, name)

        dwi._zero_init_parameter = staticmethod(zero_init)

        # A LoRA merged into a resident fp8 weight is rounded stochastically
        # (comfy.float.stochastic_rounding), with a torch.Generator on the weight's device: there is
        # none for meta. For meta tensors the result is only a tensor of the target dtype.
        import comfy.float
        rounding = comfy.float.stochastic_rounding

        def stochastic_rounding(value, dtype, seed=0):
            if getattr(value, "is_meta", False):
                return value.to(dtype=dtype)
            return rounding(value, dtype, seed=seed)

        comfy.float.stochastic_rounding = stochastic_rounding

    def bytes_on_device(self):
        total = 0
        for m in self.models:
            if getattr(m, "dynamic", False):
                # ModelPatcherDynamic moves no module: it force-loads single weights and buffers
                # (counted in model_loaded_weight_memory) and stages the rest in the VBAR, which
                # holds no memory until a forward faults it in.
                total += int(getattr(m.root, "model_loaded_weight_memory", 0)) + int(getattr(m.root, "vf_uncounted_on_device", 0))
                continue
            for mod, size in m.sizes:
                if mod._vf_on:
                    total += size
        return total

    # ----------------------------------------------------------------------------------------
    def reset(self):
        """A clean ComfyUI state: nothing loaded, the module-level settings at their defaults."""
        mm = self.mm
        if mm.current_loaded_models:
            try:
                mm.free_memory(1e30, self.load_device)
            except Exception as e:
                log.warning("unloading the previous request's models failed: %r", e)
            mm.current_loaded_models.clear()
        self.models = []
        mm.EXTRA_RESERVED_VRAM = self.defaults["EXTRA_RESERVED_VRAM"]
        mm.NUM_STREAMS = self.defaults["NUM_STREAMS"]

    def apply_view_and_policy(self, request):
        mm = self.mm
        view = request["view"]
        self.dev.set_view(view)
        mm.total_vram = self.dev.total / MIB
        scenario = request["scenario"]
        pol = scenario.get("policy", "comfy:dec2025")
        overrides = pol.get("overrides", {}) if isinstance(pol, dict) else {}
        ignored = []
        for key, value in overrides.items():
            if key == "reserve":  # --reserve-vram (APPLIED_OVERRIDES)
                mm.EXTRA_RESERVED_VRAM = parse_size(value)
            elif key == "num_streams":  # --async-offload N
                mm.NUM_STREAMS = int(value)
            else:
                ignored.append(key)
        if "offload_streams" in scenario:  # the case's NUM_STREAMS (--async-offload N / --disable-async-offload)
            mm.NUM_STREAMS = int(scenario["offload_streams"])
        if ignored:
            log.info("request %s: overrides without a ComfyUI setting, not applied: %s", request.get("id"), ", ".join(ignored))
        return ignored

    # ----------------------------------------------------------------------------------------
    def build_model(self, spec):
        torch = self.torch
        compute = canon_dtype(spec.get("compute", "bf16"))
        compute_dtype = torch_dtype(torch, compute)
        if compute_dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise Unsupported(f"model {spec['id']}: compute dtype {compute} is not a manual-cast dtype")
        modules = list(expand(spec["modules"]))
        # The weight dtype that decides the op set (ComfyUI picks it for the model's weights).
        counts = {}
        for mod in modules:
            for t in mod["tensors"]:
                if t.get("role", "weight") == "weight" or t["name"] == "weight":
                    counts[canon_dtype(t["dtype"])] = counts.get(canon_dtype(t["dtype"]), 0) + 1
        weight_name = max(counts, key=counts.get) if counts else compute
        weight_dtype = torch_dtype(torch, weight_name) or torch.uint8
        # ComfyUI's own choice of op classes for these dtypes (manual_cast when they differ).
        ops = self.ops.pick_operations(weight_dtype, compute_dtype, load_device=self.load_device)

        root = VFModel(self.model_base)
        root.vf_id = spec["id"]
        root.vf_kind = spec.get("kind", "diffusion")
        root.vf_family = spec.get("family", "generic")
        root.memory_usage_factor = float(spec.get("memory_usage_factor", 1.0))
        # The scenario's compute dtype is ComfyUI's manual_cast_dtype (model_config.manual_cast_dtype
        # for diffusion models, the CLIP's dtype override for text encoders); ComfyUI's walk reads
        # it from the root module. Where every weight is already in that dtype the dequant term is 0
        # either way.
        root.manual_cast_dtype = compute_dtype
        root.vf_weight_dtype = weight_dtype
        root.vf_compute_dtype = compute_dtype
        root.vf_arch = spec.get("arch", {})
        root.vf_lora = bool(spec.get("lora", False))

        names = [m["name"] for m in modules]
        name_set = set(names)
        objs = {}
        for mod in modules:
            objs[mod["name"]] = self.build_module(mod, ops, mod["name"] in parents_of(name_set), root)
        # Attach every module to its parent (placeholders for parents the request does not list).
        objs[""] = objs.get("", None)
        if objs[""] is not None:
            # the request's root module: its tensors belong on our root
            for pname, p in list(objs[""].named_parameters(recurse=False)):
                root.register_parameter(pname, p)
            for bname, b in list(objs[""].named_buffers(recurse=False)):
                root.register_buffer(bname, b)
        objs[""] = root
        for name in sorted(names, key=lambda n: n.count(".")):
            if name == "":
                continue
            parent = self.ensure_parent(objs, name.rpartition(".")[0])
            parent.add_module(name.rpartition(".")[2], objs[name])
        root._vf_tracked = True
        sizes = []
        for name in names:
            m = objs[name]
            m._vf_on = False
            size = sum(t.nbytes for t in m.parameters(recurse=False)) + sum(t.nbytes for t in m.buffers(recurse=False))
            sizes.append((m, size))
        for name, m in objs.items():
            m._vf_tracked = True
            if not hasattr(m, "_vf_on"):
                m._vf_on = False
        root.vf_names = names
        root.vf_objs = [objs[n] for n in names]
        root.vf_index = {id(o): i for i, o in enumerate(root.vf_objs)}
        root.vf_tensor_count = {n: len(m["tensors"]) for n, m in zip(names, modules)}
        model = types.SimpleNamespace(root=root, sizes=sizes, names=names, spec=spec)
        # Under dynamic VRAM every model is loaded by ModelPatcherDynamic, except one the request
        # marks "patcher": "legacy" (a custom node's own ModelPatcher, e.g. a GGUF loader).
        model.dynamic = self.dynamic and spec.get("patcher", "dynamic") != "legacy"
        if model.dynamic:
            # ComfyUI's loaders record each parameter's and buffer's dtype on its module
            # (model_management.archive_model_dtypes): ModelPatcherDynamic sizes a slice by it.
            self.mm.archive_model_dtypes(root)
        cls = self.dynamic_patcher_class if model.dynamic else self.patcher_class
        model.patcher = cls(root, load_device=self.load_device, offload_device=self.offload_device)
        if root.vf_lora:
            self.add_lora(model)
        return model

    def ensure_parent(self, objs, name):
        if name in objs and objs[name] is not None:
            return objs[name]
        parent = self.ensure_parent(objs, name.rpartition(".")[0]) if name else objs[""]
        holder = self.torch.nn.Module()
        parent.add_module(name.rpartition(".")[2], holder)
        objs[name] = holder
        return holder

    def make_tensor(self, t):
        torch = self.torch
        shape = [int(d) for d in t["shape"]] or []
        name = canon_dtype(t["dtype"])
        dt = torch_dtype(torch, name)
        if dt is None:
            if name not in GGUF_BLOCKS:
                raise Unsupported(f"tensor dtype {t['dtype']} has no torch dtype")
            # GGUF block types: the packed bytes as uint8, one row per row of the innermost
            # dimension (as ComfyUI-GGUF keeps them; core ComfyUI has no GGUF loader).
            block, size = GGUF_BLOCKS[name]
            rows = shape[:-1] if shape else []
            inner = shape[-1] if shape else 1
            shape = rows + [-(-inner // block) * size]
            dt = torch.uint8
        return torch.empty(shape, dtype=dt, device="meta")

    def build_module(self, mod, ops, is_container, root):
        torch = self.torch
        tensors = mod["tensors"]
        cast_hook = mod.get("cast_hook", not is_container)
        by_name = {t["name"]: t for t in tensors}
        m = None
        if cast_hook:
            w = by_name.get("weight")
            if w is None and len(tensors) == 1 and tensors[0].get("role") == "norm":
                # A norm stored as `scale` (BFL's Flux checkpoints: QKNorm's query_norm.scale):
                # ComfyUI loads it into its RMSNorm op's `weight`, and the walk counts it so.
                w = dict(tensors[0], name="weight")
                tensors = [w]
                by_name = {"weight": w}
            role = w.get("role") if w else None
            shape = [int(d) for d in w["shape"]] if w else []
            if w is None:
                m = VFCastOp()
            elif role == "embedding" and len(shape) == 2:
                m = ops.Embedding(shape[0], shape[1], device="meta", dtype=torch.float32)
            elif role == "norm" or len(shape) == 1:
                if "bias" in by_name:
                    m = ops.LayerNorm(shape, elementwise_affine=True, device="meta", dtype=torch.float32)
                else:
                    m = ops.RMSNorm(shape, elementwise_affine=True, device="meta", dtype=torch.float32)
            elif len(shape) == 2:
                m = ops.Linear(shape[1], shape[0], bias="bias" in by_name, device="meta", dtype=torch.float32)
            elif len(shape) == 3:
                m = ops.Conv1d(shape[1], shape[0], shape[2], bias="bias" in by_name, device="meta", dtype=torch.float32)
            elif len(shape) == 4:
                m = ops.Conv2d(shape[1], shape[0], tuple(shape[2:]), bias="bias" in by_name, device="meta", dtype=torch.float32)
            elif len(shape) == 5:
                m = ops.Conv3d(shape[1], shape[0], tuple(shape[2:]), bias="bias" in by_name, device="meta", dtype=torch.float32)
            else:
                m = VFCastOp()
            # The op's own parameters are replaced by the request's tensors, exactly; ComfyUI reads
            # m.weight and m.bias of every cast module, so a missing one is None, as in torch.
            for pname, _ in list(m.named_parameters(recurse=False)):
                if pname not in by_name:
                    setattr(m, pname, None)
            for pname in ("weight", "bias"):
                if pname not in by_name and not hasattr(m, pname):
                    m.register_parameter(pname, None)
        else:
            m = torch.nn.Module()
        for t in tensors:
            value = self.make_tensor(t)
            if t.get("role") == "other":
                if t["name"] in m._parameters:
                    del m._parameters[t["name"]]
                m.register_buffer(t["name"], value)
            else:
                if t["name"] in m._buffers:
                    del m._buffers[t["name"]]
                # Under aimdo the op classes initialise lazily: `weight` / `bias` are plain None
                # attributes until a state dict is loaded.
                if t["name"] in m.__dict__:
                    del m.__dict__[t["name"]]
                m.register_parameter(t["name"], torch.nn.Parameter(value, requires_grad=False))
        return m

    def add_lora(self, model):
        """A LoRA on the 2-D+ weight of every cast module but embeddings (rank 16 down/up pairs on the meta device, the
        patches ComfyUI's LoraLoader adds): the walk's LOWVRAM_PATCH_ESTIMATE_MATH_FACTOR term
        and the lowvram patch counter then come from ComfyUI itself."""
        torch = self.torch
        patches = {}
        for name, obj in zip(model.names, model.root.vf_objs):
            if not hasattr(obj, "comfy_cast_weights") or isinstance(obj, torch.nn.Embedding):
                continue  # LoRAs patch linear and conv weights, not embedding tables
            w = obj._parameters.get("weight")
            if w is None or w.dim() < 2:
                continue
            rank = 16
            out_f = w.shape[0]
            in_f = int(math.prod(w.shape[1:]))
            up = torch.empty((out_f, rank), dtype=torch.bfloat16, device="meta")
            down = torch.empty((rank, in_f), dtype=torch.bfloat16, device="meta")
            key = f"{name}.weight" if name else "weight"
            patches[key] = ("lora", (up, down, None, None, None, None))
        import comfy.weight_adapter
        adapted = {}
        for key, (kind, (up, down, alpha, mid, dora, reshape)) in patches.items():
            adapted[key] = comfy.weight_adapter.LoRAAdapter(set(), (up, down, alpha, mid, dora, reshape))
        model.patcher.add_patches(adapted, 1.0)

    # ----------------------------------------------------------------------------------------
    def resident_names(self, model):
        return [n for n, (mod, _) in zip(model.names, model.sizes) if mod._vf_on]

    def lowvram_names(self, model):
        out = []
        for n, (mod, _) in zip(model.names, model.sizes):
            # A module ComfyUI casts on the fly: it has the cast hook, is switched to casting
            # (comfy_cast_weights, set by the walk or partially_unload), and is not on the device.
            if not mod._vf_on and hasattr(mod, "comfy_cast_weights") and hasattr(mod, "prev_comfy_cast_weights"):
                out.append(n)
        return out

    def plan(self, request):
        torch = self.torch
        mm = self.mm
        self.reset()
        ignored = self.apply_view_and_policy(request)
        scenario = request["scenario"]
        self.resolve_spec_refs(request)
        for spec in scenario["models"]:
            if "modules" not in spec:
                raise Unsupported(f"model {spec.get('id')}: not inline (the request must carry its modules)")
            self.models.append(self.build_model(spec))
        index = {m.spec["id"]: i for i, m in enumerate(self.models)}
        workload = scenario.get("workload", {})
        loads, stages = [], []
        log_lines = []
        for k, stage in enumerate(scenario["pipeline"]):
            op = stage["op"]
            i = index[stage["model"]]
            if op == "load":
                lp, lines = self.load(k, i, workload)
                loads.append(lp)
                log_lines += lines
            elif op == "unload":
                self.capture.start()
                self.unload(i)
                log_lines += self.capture.stop()
            stages.append(self.stage_plan(op, i, workload))
        reserve = int(mm.extra_reserved_memory())
        plan = {"reserve": reserve, "loads": loads, "stages": stages}
        if ignored:
            log_lines.append("vramfuzz adapter: overrides not applied (no ComfyUI setting): " + ", ".join(ignored))
        self.reset()
        return plan, log_lines

    SPEC_KEYS = ("kind", "family", "memory_usage_factor", "arch", "modules")

    def resolve_spec_refs(self, request):
        """supports.spec_refs: a model written whole with "spec_ref": N is kept under N; a later
        request names only N (with its own id, compute and lora); "forget" lists specs to drop."""
        store = self.__dict__.setdefault("specs", {})
        for m in request["scenario"]["models"]:
            ref = m.pop("spec_ref", None)
            if ref is None:
                continue
            if "modules" in m:
                store[ref] = {k: m[k] for k in self.SPEC_KEYS if k in m}
            elif ref in store:
                for k, v in store[ref].items():
                    m.setdefault(k, v)
            else:
                raise Unsupported(f"model {m.get('id')}: spec_ref {ref} was never sent to this process")
        for ref in request.get("forget", []):
            store.pop(ref, None)

    # --- memory_required, as ComfyUI's sampler, VAE and CLIP compute it -----------------------
    def noise_shape(self, model, workload, batch):
        arch = model.root.vf_arch
        h = int(workload.get("height", 1024)) // 8
        w = int(workload.get("width", 1024)) // 8
        c = int(arch.get("latent_channels", 4) or 4)
        td = int(arch.get("temporal_down", 1) or 1)
        if td > 1:
            t = 1 + (int(workload.get("frames", 1)) - 1) // td
            return [batch, c, t, h, w]
        return [batch, c, h, w]

    def vae_memory_used(self, model, workload):
        # sd.py VAE.__init__, AutoencoderKL: memory_used_decode = lambda shape, dtype:
        # (2178 * shape[2] * shape[3] * 64) * dtype_size(dtype) * VAE_KL_MEM_RATIO. A lambda made
        # inside VAE.__init__ (which needs the VAE's state dict): mirrored here, for the latent of
        # the workload; note it has no batch term (ComfyUI divides free memory by it to batch).
        if model.root.vf_family not in ("vae_kl", "generic"):
            raise Unsupported(f"no VAE memory estimate for family {model.root.vf_family}")
        shape = self.noise_shape(model, workload, 1)
        return (2178 * shape[-2] * shape[-1] * 64) * self.mm.dtype_size(model.root.vf_compute_dtype) * self.vae_kl_mem_ratio

    def load(self, stage, i, workload):
        mm = self.mm
        model = self.models[i]
        kind = model.root.vf_kind
        batch = int(workload.get("batch", 1))
        before = {j: set(self.resident_names(m)) for j, m in enumerate(self.models) if j != i}
        free_before = mm.get_free_memory(self.load_device)
        mem_req, min_req_in = 0, None
        kwargs = {}
        if kind == "diffusion":
            # sampler_helpers.estimate_memory: memory_required at 2 x batch, minimum at 1 x batch
            # (no extra conds: the scenario has none).
            mem_req, min_req_in = self.sampler_helpers.estimate_memory(model.patcher, self.noise_shape(model, workload, batch), {})
            kwargs = {"memory_required": mem_req, "minimum_memory_required": min_req_in}
        elif kind == "vae":
            mem_req = self.vae_memory_used(model, workload)  # VAE.decode
            kwargs = {"memory_required": mem_req, "force_full_load": False}  # disable_offload False for KL
        else:
            kwargs = {"memory_required": 0}  # CLIP.load_model (no memory_estimation_function)
        patcher = model.patcher
        patcher.vf_calls = []
        self.capture.start()
        mm.load_models_gpu([patcher], **kwargs)
        lines = self.capture.stop()
        del patcher
        if model.dynamic:
            return self.dynamic_load(stage, model, free_before, mem_req, min_req_in, before, lines), lines
        p = model.patcher
        root = model.root
        resident = self.resident_names(model)
        lowvram = self.lowvram_names(model)
        size_of = {n: s for n, (_, s) in zip(model.names, model.sizes)}
        line = next((l for l in reversed(lines) if l.startswith("loaded partially") or l.startswith("loaded completely")), "")
        full = " full load: True" in line
        # The figures of ComfyUI's log line, in bytes: `loaded` is the walk's mem_counter (for a
        # full load, the listed modules: model_loaded_weight_memory is set to the model size
        # after the line is printed), `offloaded` its lowvram_mem_counter.
        listed = {x[2] for x in p._load_list()}
        if full:
            loaded = sum(size_of[n] for n in model.names if n in listed)
        else:
            loaded = int(root.model_loaded_weight_memory)
        offloaded = sum(size_of[n] for n in lowvram)
        total = sum(size_of.values())
        extra_mem, min_req = self.reservations(mem_req, min_req_in)
        evictions = self.evictions_since(before)
        calls = getattr(p, "vf_calls", [])
        usable = None
        for c in calls:
            if c[0] == "partially_load":
                usable = c[1]
        # ComfyUI's walk order: _load_list sorted descending (offload cost, size, name).
        loading = p._load_list()
        loading.sort(reverse=True)
        cost = {x[2]: int(x[0]) for x in loading}
        lp = {
            "stage": stage, "model": model.spec["id"],
            "resident": resident, "lowvram": lowvram,
            "offload_buffer": int(root.model_offload_buffer_memory),
            "loaded": int(loaded), "offloaded": int(offloaded), "uncounted": int(max(0, total - loaded - offloaded)),
            # ComfyUI's full load: the line says "full load: True" (a walk that placed every
            # listed module without one says "loaded completely ... full load: False"). No line:
            # the model was already loaded and partially_load returned early.
            "full_load": bool(full) if line else not lowvram,
            "evictions": evictions,
            "free_before": int(free_before), "est_max": int(mem_req), "est_min": int(min_req_in if min_req_in is not None else mem_req),
            "extra_mem": int(extra_mem), "min_req": int(min_req),
            "sorted": [x[2] for x in loading if x[2] in size_of],
            "offload_cost": [cost.get(n, size_of[n]) for n in model.names],
            "lowvram_patches": int(root.lowvram_patch_counter),
            "log_line": line,
        }
        if usable is not None and usable < 1e31:
            lp["usable"] = int(usable)
        return lp, lines

    def reservations(self, mem_req, min_req_in):
        """extra_mem and min_req: load_models_gpu's local arithmetic (R, the floor I), mirrored."""
        mm = self.mm
        reserve = mm.extra_reserved_memory()
        inference = mm.minimum_inference_memory()
        extra_mem = max(inference, mem_req + reserve)
        min_req = extra_mem if min_req_in is None else max(inference, min_req_in + reserve)
        return extra_mem, min_req

    def evictions_since(self, before):
        """The modules of other models that left the device since `before` (their resident names)."""
        evictions = []
        for j, names in before.items():
            now = set(self.resident_names(self.models[j]))
            gone = [n for n in self.models[j].names if n in names and n not in now]
            if gone:
                sz = {n: s for n, (_, s) in zip(self.models[j].names, self.models[j].sizes)}
                evictions.append({"model": self.models[j].spec["id"], "modules": gone, "bytes": sum(sz[n] for n in gone)})
        return evictions

    def dynamic_load(self, stage, model, free_before, mem_req, min_req_in, before, lines):
        """The plan of a load by ModelPatcherDynamic.load: what it staged in the model's VBAR (the
        slices its loop allocated, in its order, placed by comfy-aimdo's own ModelVBAR.alloc),
        what it force-loaded, and its log line."""
        p = model.patcher
        root = model.root
        size_of = {n: s for n, (_, s) in zip(model.names, model.sizes)}
        obj_of = dict(zip(model.names, root.vf_objs))
        # ModelPatcherDynamic.load's order: _load_list(for_dynamic=True) sorted ascending on
        # (offload cost >= 64 KiB, -offload cost, module size, name).
        loading = p._load_list(for_dynamic=True)
        loading.sort()
        walked = [x[-3] for x in loading if x[-3] in size_of]
        walked_set = set(walked)
        cost = {x[-3]: int(-x[1]) for x in loading}
        vbar = p._vbar_get()
        offsets, sizes = [], []
        for n in model.names:
            v = getattr(obj_of[n], "_v", None)
            # (vbar, address, bytes): the address is base_addr (0 here) + the slice's offset
            offsets.append(int(v[1]) if v is not None else 0)
            sizes.append(int(v[2]) if v is not None else 0)
        backed_up = set(p.backup.keys())

        def keys_of(n):
            obj = obj_of[n]
            return [f"{n}.{k}" if n else k for k, _ in obj.named_parameters(recurse=False)]

        forced_modules, uncounted = [], 0
        for n in model.names:
            obj = obj_of[n]
            if n not in walked_set:
                # Outside the walk: a container's own parameters (moved beside it by _load_list,
                # counted nowhere) and every buffer (counted): on the device.
                forced_modules.append(n)
                uncounted += sum(t.nbytes for t in obj.parameters(recurse=False))
            elif getattr(obj, "_v", None) is None and any(k in backed_up for k in keys_of(n)):
                forced_modules.append(n)
        root.vf_uncounted_on_device = uncounted
        staged = sum(sizes)
        vbar_request = int(vbar.max_size) if vbar is not None else 0
        total = int(self.dev.total)
        pages = min(-(-vbar_request // VBAR_PAGE), total // VBAR_PAGE)
        cap = pages * VBAR_PAGE
        beyond = sum(1 for o, z in zip(offsets, sizes) if z and o + z > cap)
        line = next((l for l in reversed(lines) if "prepared for dynamic VRAM loading" in l), "")
        m = re.search(r"(\d+) patches attached", line)
        patches = int(m.group(1)) if m else 0
        forced_bytes = int(root.model_loaded_weight_memory)
        evictions = self.evictions_since(before)
        extra_mem, min_req = self.reservations(mem_req, min_req_in)
        return {
            "stage": stage, "model": model.spec["id"], "dynamic": True,
            "resident": forced_modules, "lowvram": [], "offload_buffer": 0,
            "loaded": forced_bytes, "offloaded": int(staged), "uncounted": int(uncounted), "full_load": False,
            "evictions": evictions,
            "free_before": int(free_before), "est_max": int(mem_req), "est_min": int(min_req_in if min_req_in is not None else mem_req),
            "extra_mem": int(extra_mem), "min_req": int(min_req),
            "sorted": walked, "log_line": line,
            "staging": {
                "vbar_request": vbar_request, "vbar_pages": int(pages), "staged": int(staged),
                "vbar_end": int(vbar.offset) if vbar is not None else 0, "patches": patches, "forced": len(p.backup),
                "forced_bytes": forced_bytes, "uncounted": int(uncounted), "order": walked,
                "offload_cost": [cost.get(n, 0) for n in model.names],  # the sort key of walked modules
                "slice_offset": offsets, "slice_size": sizes, "forced_modules": forced_modules,
                "slices_beyond_cap": int(beyond),
            },
        }

    def unload(self, i):
        # unload_model_and_clones(patcher) calls free_memory(1e30, get_torch_device(), keep_loaded);
        # our patchers live on the meta:0 load device, so the same call is made for that device.
        mm = self.mm
        target = self.models[i].patcher
        keep = [lm for lm in mm.current_loaded_models if lm.model is not target]
        del target
        mm.free_memory(1e30, self.load_device, keep_loaded=keep)

    def stage_plan(self, op, i, workload):
        mm = self.mm
        model = self.models[i]
        kind = model.root.vf_kind
        batch = int(workload.get("batch", 1))
        cfg = float(workload.get("cfg", 1.0))
        # The inference floor the allowance never goes below: minimum_inference_memory() without
        # the reserve (vramfuzz's stage convention; ComfyUI has no per-stage function for it).
        floor = int(mm.minimum_inference_memory() - mm.extra_reserved_memory())
        run_batch, passes, est = batch, 1, 0
        decode_batch = 0
        if kind == "diffusion":
            # samplers.calc_cond_batch: cond and uncond (cfg > 1; cfg == 1 skips uncond) are run
            # together while memory_required(both) * 1.5 < the patcher's free memory. A loop inside
            # the sampler that runs the model: mirrored, with ComfyUI's memory_required and
            # ModelPatcher.get_free_memory.
            free = model.patcher.get_free_memory(self.load_device)
            est = model.root.memory_required(self.noise_shape(model, workload, batch))
            if cfg > 1.0:
                both = model.root.memory_required(self.noise_shape(model, workload, 2 * batch))
                if both * 1.5 < free:
                    run_batch, est = 2 * batch, both
                else:
                    passes = 2
        elif kind == "vae":
            # VAE.decode: batch_number = max(1, int(free / memory_used)) samples per decode call.
            per = self.vae_memory_used(model, workload)
            free = model.patcher.get_free_memory(self.load_device)
            decode_batch = max(1, int(free / per)) if per > 0 else batch
            # Each decode call runs batch_number samples: that is the forward's row count, and
            # the batch takes ceil(batch / batch_number) calls.
            run_batch = min(batch, decode_batch)
            passes = -(-batch // run_batch)
            est = per * run_batch
        resident_total = self.bytes_on_device()
        offload_buffer = 0 if op == "unload" or model.dynamic else int(model.root.model_offload_buffer_memory)
        allowance = int(max(floor, est))
        # A dynamic model's stage has no prediction to hold it to (weights are placed at run
        # time), as vramfuzz's own dynamic presets say.
        checked = op != "unload" and not model.dynamic
        sp = {"checked": checked, "resident_total": int(resident_total), "offload_buffer": offload_buffer,
              "activation_allowance": allowance, "run_batch": int(run_batch), "passes": int(passes),
              # vramfuzz's peak convention (predictors/comfy_classic.cpp): weights on the device +
              # the offload buffer + the activation allowance. ComfyUI predicts no peak itself.
              "predicted_peak": int(resident_total + offload_buffer + (allowance if checked else 0))}
        if model.dynamic:
            # The free memory the patcher reported to the sampler / VAE (ModelPatcherDynamic's
            # get_free_memory: torch's and aimdo's, what the batching decisions above read).
            sp["dynamic"] = True
            sp["patcher_free"] = int(model.patcher.get_free_memory(self.load_device))
        if decode_batch:
            # the samples per decode call (batch_number, at most the batch: the protocol caps
            # decode_batch at the workload's 64)
            sp["decode_batch"] = int(min(decode_batch, batch))
        return sp


def parents_of(names):
    out = set()
    for n in names:
        while n:
            n = n.rpartition(".")[0]
            out.add(n)
    return out


def make_patcher_class(base):
    """ModelPatcher, recording the budget load_models_gpu hands to partially_load (the log line
    prints it plus what was already loaded). Behaviour unchanged."""

    class VFModelPatcher(base):
        def partially_load(self, device_to, extra_memory=0, force_patch_weights=False):
            self.__dict__.setdefault("vf_calls", []).append(("partially_load", extra_memory))
            return super().partially_load(device_to, extra_memory=extra_memory, force_patch_weights=force_patch_weights)

    VFModelPatcher.__name__ = "ModelPatcher"
    return VFModelPatcher


class VFCastOp:  # replaced below by a torch module class once torch is imported
    pass


def VFModel(model_base):
    """The root module of a built model: BaseModel's memory_required (ComfyUI's function, bound
    to this module's memory_usage_factor and manual_cast_dtype)."""
    import torch

    class VFModelRoot(torch.nn.Module):
        memory_usage_factor_conds = ()
        memory_usage_shape_process = {}
        memory_required = model_base.BaseModel.memory_required
        get_dtype_inference = model_base.BaseModel.get_dtype_inference

        def get_dtype(self):
            return self.vf_weight_dtype

        def extra_conds_shapes(self, **kwargs):
            return {}

    return VFModelRoot()


class LogCapture(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.lines = None

    def start(self):
        self.lines = []

    def stop(self):
        out, self.lines = self.lines or [], None
        return out

    def emit(self, record):
        if self.lines is not None:
            try:
                self.lines.append(record.getMessage())
            except Exception:
                pass


def parse_size(v):
    if isinstance(v, (int, float)):
        return int(v)
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?B)?\s*", str(v))
    if not m:
        raise Unsupported(f"size {v!r}")
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2)]
    return int(float(m.group(1)) * mult)


def comfy_version(path):
    version = "unknown"
    try:
        text = open(os.path.join(path, "comfyui_version.py")).read()
        version = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text).group(1)
    except Exception:
        pass
    commit = os.environ.get("COMFYUI_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "-C", path, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                    text=True, timeout=5).stdout.strip()
        except Exception:
            commit = ""
    if not commit:
        try:
            commit = open(os.path.join(path, ".comfyui_commit")).read().strip()[:12]
        except Exception:
            commit = ""
    return f"{version}+{commit}" if commit else version


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--comfyui", default=os.environ.get("COMFYUI_PATH"), help="a ComfyUI checkout (env COMFYUI_PATH)")
    ap.add_argument("--runtime", default="comfy:dec2025", choices=["comfy:dec2025"] + list(DYNAMIC_RUNTIMES),
                    help="the runtime the plans are for: comfy:dec2025 (the classic, estimate-based path, "
                         "--disable-dynamic-vram) or comfy:sep2026 (dynamic VRAM: ModelPatcherDynamic with comfy-aimdo)")
    ap.add_argument("--name", default="comfyui", help="the name vramfuzz records (default comfyui)")
    ap.add_argument("--no-spec-refs", action="store_true",
                    help="do not say supports.spec_refs (every request then carries every model whole)")
    args = ap.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="comfyui-adapter: %(levelname)s %(message)s")
    log.setLevel(logging.INFO)
    if not args.comfyui:
        print("comfyui_predictor: give --comfyui PATH (or set COMFYUI_PATH)", file=sys.stderr)
        return 2
    proto = take_stdout()
    t0 = time.time()
    global VFCastOp
    import torch

    class _VFCastOp(torch.nn.Module):
        """A cast-hook module with no `weight` (e.g. a bare modulation vector): ComfyUI's walk only
        asks for the comfy_cast_weights attribute."""
        comfy_cast_weights = True
        weight_function = []
        bias_function = []

    VFCastOp = _VFCastOp
    adapter = ComfyAdapter(args.comfyui, args.runtime)
    # The root logger: INFO, so ComfyUI's "loaded partially ..." lines reach the capture; they
    # are printed to stderr only at --verbose levels (the handler below filters).
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for h in root.handlers:
        if h is not adapter.capture:
            h.setLevel(logging.WARNING)
    log.info("ComfyUI %s at %s ready in %.1f s", adapter.version, adapter.comfy_path, time.time() - t0)
    hello = {"schema": "vramfuzz.predictor/1", "type": "hello", "name": args.name,
             "version": adapter.version, "runtime": args.runtime}
    # The overrides that have a ComfyUI setting (apply_view_and_policy): vramfuzz refuses the
    # others instead of sending them to be ignored.
    hello["supports"] = {"overrides": list(APPLIED_OVERRIDES)}
    if not args.no_spec_refs:
        hello["supports"]["spec_refs"] = True  # each model's spec is sent once (docs/predictor-protocol.md)
    proto.write(json.dumps(hello) + "\n")
    proto.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError as e:
            log.error("a request that is not JSON: %r", e)
            continue
        rid = request.get("id", 0)
        try:
            plan, lines = adapter.plan(request)
            reply = {"type": "plan", "id": rid, "plan": plan, "log": lines}
        except Unsupported as e:
            reply = {"type": "error", "id": rid, "message": f"comfyui adapter: {e}"}
            adapter.reset()
        except Exception as e:  # a bug or a ComfyUI failure: say so, keep serving
            import traceback
            traceback.print_exc(file=sys.stderr)
            reply = {"type": "error", "id": rid, "message": f"comfyui adapter: ComfyUI failed: {type(e).__name__}: {e}"}
            try:
                adapter.reset()
            except Exception:
                pass
        proto.write(json.dumps(reply) + "\n")
        proto.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
