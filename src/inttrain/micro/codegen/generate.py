"""Generate C99 training code for a micro model: forward, backward and the integer SGD of
docs/integer-training.md, with every buffer static and sized here, at generation time.

The output directory holds the fixed runtime (``inttrain_rt.c/.h``, copied from this package: the C twin of
micro's layers) and the generated model (``model_config.h``, ``model.h``, ``model.c``): static buffers, the
initial master codes as const tables and one straight-line forward and backward that call the runtime with
constant shapes. Buffer plan: each layer output has its own int8 buffer (the
backward needs every saved activation; a ReLU masks its producer's output in place when nothing else reads it);
input errors (``it_ecode_t``: int8, or int16 for a model with ``error_bits`` 16) share a pool of slots reused
once consumed (a residual keeps its incoming error while both branches run; a ReLU masks an error it owns in
place); with 16-bit errors, one int8 scratch buffer holds the error a linear or conv layer rounds to int8 for its
two backward GEMMs; one
int32 scratch accumulator is shared by all GEMMs and requantizations; weight gradients are never stored (each
is applied to its weight as soon as it is summed, after the layer's input error was formed with the old weight).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from ..layers import AvgPool2d, BatchNorm, Conv2d, Flatten, Linear, MaxPool2d, Param, ReLU, Residual, layer_named_params
from ..model import Sequential

MODES = {"rne": "IT_RNE", "pstoch": "IT_PSTOCH", "floor": "IT_FLOOR", "hstoch": "IT_HSTOCH"}
RUNTIME_FILES = ("inttrain_rt.h", "inttrain_rt.c")
MAX_BUFFER = (1 << 31) - 1          # element counts and indices are uint32 in the runtime
CTYPE_BYTES = {"int8_t": 1, "uint8_t": 1, "int16_t": 2, "uint16_t": 2, "int32_t": 4, "uint32_t": 4}


@dataclass
class Node:
    """One layer as placed in the generated code: its C names, exponent variables and shapes."""

    layer: object
    path: str
    inp: str
    in_exp: str
    in_shape: tuple
    out: str = ""
    out_exp: str = ""
    out_shape: tuple = ()
    children: dict = field(default_factory=dict)     # residual: {"block": [Node], "shortcut": [Node]}


@dataclass
class GeneratedModel:
    """The generated files (name -> text) and the static memory they declare, in bytes."""

    files: dict[str, str]
    buffer_bytes: int          # activations, errors, saved statistics, scratch (RAM, .bss)
    param_bytes: int           # master codes (+ momentum) in RAM
    init_bytes: int            # const initial codes (flash)

    def write(self, out_dir: str | os.PathLike) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in self.files.items():
            tmp = out / (name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, out / name)
        return out


def _numel(shape) -> int:
    return int(np.prod(shape))


class _Gen:
    def __init__(self, model: Sequential, batch: int, lr_shift: int, momentum_shift: int | None, low_ram: bool):
        self.model, self.batch, self.lr_shift, self.mshift = model, batch, lr_shift, momentum_shift
        self.fwd_acc = "0" if low_ram else "it_acc"     # 0: the runtime recomputes instead of storing
        r = model.desc["rounding"]
        self.fmode, self.bmode, self.umode = MODES[r["forward"]], MODES[r["backward"]], MODES[r["update"]]
        self.bufs: list[tuple[str, str, int]] = []      # (ctype, name, count)
        self.exps: list[str] = []
        self.acc = 1
        self.fwd: list[str] = []
        self.bwd: list[str] = []
        self.slots: list[int] = []                      # error-buffer pool: largest use of each slot
        self.busy: set[int] = set()
        self.pnames = {id(p): (n, f"P{i}") for i, (n, p) in enumerate(model.named_params())}
        self.wide: set[str] = set()                     # buffers of 16-bit codes (conv2d out_bits 16)
        self.err_bits = model.err_bits                  # error codes: it_ecode_t, int8 or int16 (error_bits 16)
        self.g8 = 0                                     # int8 scratch for a 16-bit error as a GEMM operand

    def buf(self, ctype: str, name: str, count: int) -> str:
        if count > MAX_BUFFER:
            raise ValueError(f"codegen: buffer {name} of {count} elements exceeds the runtime's 2**31 - 1 limit")
        self.bufs.append((ctype, name, count))
        return name

    def exp(self, name: str) -> str:
        self.exps.append(name)
        return name

    def need_acc(self, count: int) -> None:
        self.acc = max(self.acc, count)

    def need_gemm_acc(self, count: int) -> None:
        if self.fwd_acc != "0":
            self.need_acc(count)

    def view_shift(self, path: str, codes: str, p: Param) -> str:
        """Emit the forward's int8-view shift of a linear / conv weight (§1; it_view_shift: 8 for the fixed view of
        int16 codes, the tensor's own with weight_view "tensor", 0 for int8 codes) into ``L<path>_ws``, which the
        input-gradient GEMM reuses (the weight changes only in its update, after that GEMM); returns the name."""
        name = self.exp(f"L{path}_ws")
        self.fwd.append(f"{name} = it_view_shift({codes}, {p.acc.size}u);")
        return name

    def param(self, p: Param) -> tuple[str, str, int]:
        """(codes array, momentum array or 0, exponent) of a parameter."""
        c = self.pnames[id(p)][1]
        return c, (f"{c}_mom" if self.mshift else "0"), p.exp

    # ---- forward ------------------------------------------------------------------------------
    def forward(self, layers, inp: str, in_exp: str, shape: tuple, prefix: str) -> tuple[list[Node], str, str, tuple]:
        nodes = []
        private = False                 # is ``inp`` read by this layer only (not the chain's input)?
        for i, layer in enumerate(layers):
            node = Node(layer, f"{prefix}{i}", inp, in_exp, tuple(shape))
            self._fwd_node(node, private)
            nodes.append(node)
            private = private or not isinstance(layer, Flatten)
            inp, in_exp, shape = node.out, node.out_exp, node.out_shape
        return nodes, inp, in_exp, tuple(shape)

    def _fwd_node(self, nd: Node, private: bool) -> None:
        L, B, p = nd.layer, self.batch, nd.path
        nd.out_shape = tuple(L.out_shape(nd.in_shape))
        n_in, n_out = _numel(nd.in_shape), _numel(nd.out_shape)
        if isinstance(L, Flatten):
            nd.out, nd.out_exp = nd.inp, nd.in_exp
            return
        if isinstance(L, ReLU) and private:
            # in place: no backward reads the producer's output (linear/conv/batchnorm/pools keep what they
            # need elsewhere), and the masked codes are exactly what ReLU's own backward reads
            nd.out, nd.out_exp = nd.inp, nd.in_exp
            self.fwd.append(f"it_relu_fwd({nd.inp}, n * {n_in}u, {nd.inp});")
            return
        if isinstance(L, Residual):
            bn, bo, be, bs = self.forward(L.block, nd.inp, nd.in_exp, nd.in_shape, f"{p}_b")
            sn, so, se, _ = self.forward(L.shortcut, nd.inp, nd.in_exp, nd.in_shape, f"{p}_s")
            nd.children = {"block": bn, "shortcut": sn}
            nd.out, nd.out_exp = self.buf("int8_t", f"L{p}_y", B * n_out), self.exp(f"L{p}_ye")
            self.need_acc(B * n_out)
            self.fwd.append(f"{nd.out_exp} = it_add_aligned({bo}, {be}, {so}, {se}, n * {n_out}u, it_acc, {nd.out}, {self.fmode});")
            return
        wide = isinstance(L, Conv2d) and L.out_bits == 16         # 16-bit codes into the batch norm that follows
        nd.out, nd.out_exp = self.buf("int16_t" if wide else "int8_t", f"L{p}_y", B * n_out), self.exp(f"L{p}_ye")
        y, ye, x, xe = nd.out, nd.out_exp, nd.inp, nd.in_exp
        if wide:
            self.wide.add(y)
        if isinstance(L, Linear):
            w, _, e = self.param(L.weight)
            ws = self.view_shift(p, w, L.weight)
            self.need_gemm_acc(B * n_out)
            self.fwd.append(f"{ye} = it_linear_fwd({x}, {xe}, {w}, {ws}, {e} + {ws}, n, {n_in}u, {n_out}u, "
                            f"{self.fwd_acc}, {y}, {self.fmode});")
        elif isinstance(L, Conv2d):
            w, _, e = self.param(L.weight)
            ws = self.view_shift(p, w, L.weight)
            c, h, wd = nd.in_shape
            o, oh, ow = nd.out_shape
            self.bufs.append(("", f"static const it_conv_t L{p}_cv = {{{c}u, {h}u, {wd}u, {o}u, {L.kernel_size}u, "
                                  f"{L.stride}u, {L.padding}u, {oh}u, {ow}u}};", 0))
            self.need_gemm_acc(B * n_out)
            self.fwd.append(f"{ye} = it_conv_fwd{'16' if wide else ''}(&L{p}_cv, {x}, {xe}, {w}, {ws}, {e} + {ws}, "
                            f"n, {self.fwd_acc}, {y}, {self.fmode});")
        elif isinstance(L, ReLU):
            self.fwd.append(f"it_relu_fwd({x}, n * {n_in}u, {y}); {ye} = {xe};")
        elif isinstance(L, MaxPool2d):
            c, h, wd = nd.in_shape
            arg = self.buf("uint8_t", f"L{p}_arg", B * n_out)
            self.fwd.append(f"it_maxpool_fwd({x}, n * {c}u, {h}u, {wd}u, {L.kernel_size}u, {y}, {arg}); {ye} = {xe};")
        elif isinstance(L, AvgPool2d):
            c, h, wd = nd.in_shape
            kh, kw = (h, wd) if L.global_pool else (L.kernel_size, L.kernel_size)
            self.need_acc(B * n_out)
            self.fwd.append(f"{ye} = it_avgpool_fwd({x}, {xe}, n * {c}u, {h}u, {wd}u, {kh}u, {kw}u, it_acc, {y}, {self.fmode});")
        elif isinstance(L, BatchNorm):
            c = nd.in_shape[0]
            g, _, ge = self.param(L.gamma)
            b, _, be = self.param(L.beta)
            self.bufs.append(("", f"static const it_bn_t L{p}_bn = {{{c}u, {n_in // c}u, {L.gain_shift}}};", 0))
            xh = self.buf("int8_t", f"L{p}_xh", B * n_in)
            rng, live = self.buf("uint16_t", f"L{p}_range", c), self.buf("uint8_t", f"L{p}_live", c)
            x8, x16 = ("0", x) if x in self.wide else (x, "0")
            self.fwd.append(f"{ye} = it_bn_fwd(&L{p}_bn, {x8}, {x16}, n, {g}, {ge}, {b}, {be}, {xh}, {rng}, {live}, {y}, "
                            f"{self.fmode});")
        else:                                        # pragma: no cover - every micro layer is handled above
            raise ValueError(f"codegen: layer {type(L).__name__} is not supported")

    # ---- backward -----------------------------------------------------------------------------
    # Error buffers come from a pool of slots (it_g0, it_g1, ...) sized to their largest use: a layer's input
    # error takes a free slot, and its output error's slot is released once the layer has consumed it. The
    # error a chain receives belongs to the caller (a residual still needs it for the shortcut and the add).
    def alloc(self, count: int) -> str:
        free = [i for i in range(len(self.slots)) if i not in self.busy]
        fits = [i for i in free if self.slots[i] >= count]
        if fits:
            i = min(fits, key=lambda j: self.slots[j])
        elif free:
            i = max(free, key=lambda j: self.slots[j])
            self.slots[i] = count
        else:
            i = len(self.slots)
            self.slots.append(count)
        self.busy.add(i)
        return f"it_g{i}"

    def release(self, name: str) -> None:
        if name.startswith("it_g"):
            self.busy.discard(int(name[4:]))

    def backward(self, nodes: list[Node], g: str, ge: str, need_input: bool,
                 owned: bool = False) -> tuple[str, str, bool] | None:
        """Emit the chain's backward from output error (g, ge); returns (input error, exponent, owned) or None."""
        for i in range(len(nodes) - 1, -1, -1):
            res = self._bwd_node(nodes[i], g, ge, need_input or i > 0, owned)
            if res is None:
                if owned:
                    self.release(g)
                return None
            if res[0] != g:
                if owned:
                    self.release(g)
                owned = True
            g, ge = res
        return g, ge, owned

    def _gx(self, nd: Node) -> tuple[str, str]:
        return self.alloc(self.batch * _numel(nd.in_shape)), self.exp(f"L{nd.path}_gxe")

    def _bwd_node(self, nd: Node, g: str, ge: str, need: bool, owned: bool) -> tuple[str, str] | None:
        """Emit one layer's backward (input error first, then the weight update); None: no input error."""
        L, p, x, xe, lr, ms = nd.layer, nd.path, nd.inp, nd.in_exp, "it_lr_shift", self.mshift or 0
        n_in, n_out = _numel(nd.in_shape), _numel(nd.out_shape)
        if isinstance(L, Flatten):
            return (g, ge) if need else None
        if isinstance(L, Residual):
            gb = self.backward(nd.children["block"], g, ge, need)
            gs = self.backward(nd.children["shortcut"], g, ge, need) if nd.children["shortcut"] else (g, ge, False)
            if not need:
                return None
            gx, gxe = self._gx(nd)
            self.bwd.append(f"{gxe} = it_add_aligned_bwd({gb[0]}, {gb[1]}, {gs[0]}, {gs[1]}, n * {n_in}u, it_acc, {gx}, "
                            f"{self.bmode});")
            for name, _, own in (gb, gs):
                if own:
                    self.release(name)
            return gx, gxe
        if isinstance(L, (Linear, Conv2d)):
            w, mom, e = self.param(L.weight)
            out = None
            if self.err_bits == 16:                     # micro's gemm_error: the int8 operand of both GEMMs
                self.g8 = max(self.g8, self.batch * n_out)
                g8e = self.exp(f"L{p}_g8e")
                self.bwd.append(f"{g8e} = it_error_int8({g}, {ge}, n * {n_out}u, it_err8, {self.bmode});")
                g, ge = "it_err8", g8e
            if need:
                gx, gxe = out = self._gx(nd)
                self.need_acc(self.batch * n_in)
                ws = f"L{p}_ws"                         # the forward's view (the update comes below)
                if isinstance(L, Linear):
                    self.bwd.append(f"{gxe} = it_linear_bwd_input({g}, {ge}, {w}, {ws}, {e} + {ws}, n, {n_in}u, "
                                    f"{n_out}u, it_acc, {gx}, {self.bmode});")
                else:
                    self.bwd.append(f"{gxe} = it_conv_bwd_input(&L{p}_cv, {g}, {ge}, {w}, {ws}, {e} + {ws}, n, "
                                    f"it_acc, {gx}, {self.bmode});")
            if isinstance(L, Linear):
                self.bwd.append(f"it_linear_bwd_update({g}, {ge}, {x}, {xe}, {w}, {mom}, {e}, n, {n_in}u, {n_out}u, "
                                f"{lr}, {self.umode}, {ms});")
            else:
                self.bwd.append(f"it_conv_bwd_update(&L{p}_cv, {g}, {ge}, {x}, {xe}, {w}, {mom}, {e}, n, {lr}, "
                                f"{self.umode}, {ms});")
            return out
        if isinstance(L, BatchNorm):
            gm, gmom, gexp = self.param(L.gamma)
            bt, bmom, bexp = self.param(L.beta)
            gx, gxe = self._gx(nd) if need else ("0", None)
            self.need_acc(self.batch * n_in)
            call = (f"it_bn_bwd(&L{p}_bn, {g}, {ge}, {xe}, n, L{p}_xh, L{p}_range, L{p}_live, {gm}, {gmom}, {gexp}, {bt}, "
                    f"{bmom}, {bexp}, it_acc, {gx}, {lr}, {self.bmode}, {self.umode}, {ms});")
            self.bwd.append(f"{gxe} = {call}" if need else f"(void){call}")
            return (gx, gxe) if need else None
        if not need:
            return None
        if isinstance(L, ReLU) and owned:               # the error is ours: mask it in place
            self.bwd.append(f"it_relu_bwd({nd.out}, {g}, n * {n_in}u, {g});")
            return g, ge
        gx, gxe = self._gx(nd)
        if isinstance(L, ReLU):
            self.bwd.append(f"it_relu_bwd({nd.out}, {g}, n * {n_in}u, {gx}); {gxe} = {ge};")
        elif isinstance(L, MaxPool2d):
            c, h, wd = nd.in_shape
            self.bwd.append(f"it_maxpool_bwd({g}, L{p}_arg, n * {c}u, {h}u, {wd}u, {L.kernel_size}u, {gx}); {gxe} = {ge};")
        elif isinstance(L, AvgPool2d):
            c, h, wd = nd.in_shape
            kh, kw = (h, wd) if L.global_pool else (L.kernel_size, L.kernel_size)
            self.bwd.append(f"{gxe} = it_avgpool_bwd({g}, {ge}, n * {c}u, {h}u, {wd}u, {kh}u, {kw}u, {gx}, {self.bmode});")
        return gx, gxe


def _c_array(values: np.ndarray, per_line: int = 16) -> str:
    flat = [str(int(v)) for v in values.reshape(-1)]
    return ",\n    ".join(", ".join(flat[i:i + per_line]) for i in range(0, len(flat), per_line))


def generate(model: Sequential, batch_size: int, lr_shift: int, momentum_shift: int | None = None,
             source: str = "", low_ram: bool = False) -> GeneratedModel:
    """C99 sources training ``model`` at batches of up to ``batch_size`` samples (see the module docstring).

    ``low_ram``: linear and conv forwards recompute each dot product in a second pass instead of holding their
    int32 accumulators (the largest buffer of a convolutional net; twice the forward MACs). Same results.

    Raises ValueError for arguments the integer arithmetic does not allow (the same checks as ``train``).
    """
    if not 1 <= batch_size <= 65536:
        raise ValueError(f"--batch-size {batch_size}: must be in [1, 65536]")
    if not 0 <= lr_shift <= 62:
        raise ValueError(f"--lr-shift {lr_shift}: must be in [0, 62]")
    if momentum_shift is not None and not 1 <= momentum_shift <= 16:
        raise ValueError(f"--momentum-shift {momentum_shift}: must be in [1, 16]")
    model.check_batch(batch_size)
    d = model.desc
    gen = _Gen(model, batch_size, lr_shift, momentum_shift, low_ram)
    in_shape = tuple(d["input_shape"])
    nodes, out, out_exp, _ = gen.forward(model.layers, "it_x", "it_xe", in_shape, "")
    classes = d["num_classes"]
    err = gen.buf("it_ecode_t", "it_err", batch_size * classes)
    gen.backward(nodes, err, "it_err_e", False)
    named = model.named_params()
    bits = d["weight_bits"]
    wsize = 2 if bits == 16 else 1
    params_c, table, init = _params_c(named, bits, momentum_shift is not None)
    gen.bufs += [("it_ecode_t", f"it_g{i}", c) for i, c in enumerate(gen.slots)]
    if gen.g8:
        gen.bufs.append(("int8_t", "it_err8", gen.g8))
    buffers = [f"static {t} {n}[{c}];" if t else n for t, n, c in gen.bufs]
    buffers.append(f"static int32_t it_acc[{gen.acc}];")
    sizes = {**CTYPE_BYTES, "it_ecode_t": gen.err_bits // 8}
    buffer_bytes = sum(c * sizes[t] for t, _, c in gen.bufs if t) + 4 * gen.acc
    n_params = sum(p.acc.size for _, p in named)
    param_bytes = n_params * (wsize + (4 if momentum_shift else 0))
    source = source.replace("*/", "* /").replace("\n", " ")     # it goes into a C comment
    consts = {"batch": batch_size, "insize": _numel(in_shape), "classes": classes, "nparams": len(named)}
    files = {name: resources.files(__package__).joinpath(name).read_text() for name in RUNTIME_FILES}
    tensor_view = int(d.get("weight_view", "fixed") == "tensor")    # the int8 view's shift rule (§1)
    files["model_config.h"] = (f"/* generated by inttrain.micro codegen */\n#ifndef MODEL_CONFIG_H\n#define MODEL_CONFIG_H\n"
                               f"#define IT_WEIGHT_BITS {bits}\n#define IT_ERROR_BITS {gen.err_bits}\n"
                               f"#define IT_WEIGHT_VIEW_TENSOR {tensor_view}\n#endif\n")
    files["model.h"] = _MODEL_H.format(**consts, source=source, desc=json.dumps(_short_desc(d)))
    files["model.c"] = _MODEL_C.format(
        **consts, source=source, lr_shift=lr_shift, mshift=momentum_shift or 0,
        exps="\n".join(f"static int32_t {e};" for e in ["it_xe", "it_err_e", *gen.exps]),
        buffers="\n".join(buffers), params="\n".join(params_c), table="\n".join(table) or "    {0, 0, 0, 0, 0},",
        init="\n".join(init), forward="\n    ".join(gen.fwd), backward="\n    ".join(gen.bwd), out=out, out_exp=out_exp,
        err_exp=1 - gen.err_bits)
    return GeneratedModel(files, buffer_bytes, param_bytes, n_params * wsize)


def _params_c(named: list, bits: int, momentum: bool) -> tuple[list[str], list[str], list[str]]:
    """Declarations (RAM codes, const initial codes, momentum), the model_params rows, model_init's lines."""
    params_c, table, init = [], [], []
    for i, (name, p) in enumerate(named):
        cnt = p.acc.size
        params_c.append(f"static it_wcode_t P{i}[{cnt}];")
        params_c.append(f"static const it_wcode_t P{i}_init[{cnt}] = {{\n    {_c_array(p.acc)}\n}};")
        table.append(f'    {{"{name}", P{i}, {cnt}u, {p.exp}, {bits}}},')
        init.append(f"    memcpy(P{i}, P{i}_init, sizeof P{i});")
        if momentum:
            params_c.append(f"static int32_t P{i}_mom[{cnt}];")
            init.append(f"    memset(P{i}_mom, 0, sizeof P{i}_mom);")
    return params_c, table, init


def _short_desc(d: dict) -> dict:
    return {k: d[k] for k in ("input_shape", "weight_bits", "rounding", "error_bits", "weight_view") if k in d}


_MODEL_H = """/* generated by inttrain.micro codegen from {source}; do not edit.
 * {desc}
 * Integer-only training (docs/integer-training.md): no malloc, no float, static buffers. */
#ifndef MODEL_H
#define MODEL_H
#include <stdint.h>

#define MODEL_BATCH {batch}          /* largest batch train_step / predict accept */
#define MODEL_INPUT_SIZE {insize}    /* int8 codes per sample */
#define MODEL_NUM_CLASSES {classes}
#define MODEL_NUM_PARAMS {nparams}

/* one learnable tensor: master codes (int16 or int8, value = code * 2**exp), read and written in place */
typedef struct {{ const char *name; void *codes; uint32_t count; int32_t exp; int32_t bits; }} model_param_t;
extern const model_param_t model_params[];

/* (re)load the initial codes the model was generated from and clear the momentum */
void model_init(void);
/* learning rate 2**-lr_shift on the summed batch gradient (0..62) */
void model_set_lr_shift(int32_t lr_shift);
/* one SGD step on n <= MODEL_BATCH samples x (n * MODEL_INPUT_SIZE codes at exponent x_exp) with labels;
 * returns 0, -1 for a bad n, -2 for a label outside [0, MODEL_NUM_CLASSES) (nothing changed then) */
int model_train_step(const int8_t *x, int32_t x_exp, const int32_t *labels, uint32_t n);
/* class of each of n <= MODEL_BATCH samples (batch statistics, as micro's predict); 0 or -1 for a bad n */
int model_predict(const int8_t *x, int32_t x_exp, uint32_t n, int32_t *pred);
/* the int8 logits (n * MODEL_NUM_CLASSES) of the last train_step / predict and their exponent */
const int8_t *model_logits(int32_t *exp);
#endif
"""

_MODEL_C = """/* generated by inttrain.micro codegen from {source}; do not edit. */
#include "model.h"
#include "inttrain_rt.h"

/* ---- master codes (RAM) and their initial values (flash) ---- */
{params}

const model_param_t model_params[] = {{
{table}
}};

/* ---- activations, errors, saved statistics, scratch ---- */
static const int8_t *it_x;
{exps}
static int32_t it_lr_shift = {lr_shift};
{buffers}

void model_init(void)
{{
{init}
}}

void model_set_lr_shift(int32_t lr_shift)
{{
    it_lr_shift = lr_shift;
}}

static void forward(uint32_t n)
{{
    {forward}
}}

static void backward(uint32_t n)
{{
    (void)n;
    {backward}
}}

const int8_t *model_logits(int32_t *exp)
{{
    *exp = {out_exp};
    return {out};
}}

int model_predict(const int8_t *x, int32_t x_exp, uint32_t n, int32_t *pred)
{{
    if (n < 1 || n > MODEL_BATCH)
        return -1;
    it_x = x;
    it_xe = x_exp;
    forward(n);
    it_argmax({out}, n, MODEL_NUM_CLASSES, pred);
    return 0;
}}

int model_train_step(const int8_t *x, int32_t x_exp, const int32_t *labels, uint32_t n)
{{
    uint32_t i;
    if (n < 1 || n > MODEL_BATCH)
        return -1;
    for (i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= MODEL_NUM_CLASSES)
            return -2;
    it_x = x;
    it_xe = x_exp;
    forward(n);
    it_softmax_xent_grad({out}, {out_exp}, labels, n, MODEL_NUM_CLASSES, it_err);
    it_err_e = {err_exp};
    backward(n);
    return 0;
}}
"""
