"""The C header's enums as Python ``IntEnum`` classes, generated when this module is
imported from the compiled extension's own type information (cffi keeps each
``enum pi_*`` of ``native/include/powerinfer.h`` with its names and values), so no value
is copied by hand. Member names drop the C prefix: ``Act.SILU`` is ``PI_ACT_SILU``."""

from __future__ import annotations

import enum
from typing import Any

from ._pi_native import ffi

__all__ = ["Status", "Type", "RopeType", "Act", "LayerSlot", "FfnThresholdOn", "FfnForm", "IsaBit", "ProfOp"]


def _from_c(name: str, c_enum: str, prefix: str) -> Any:  # an IntEnum class: its members are known at import only
    members = {k[len(prefix) :]: v for k, v in ffi.typeof(f"enum {c_enum}").relements.items() if k.startswith(prefix)}
    return enum.IntEnum(name, sorted(members.items(), key=lambda kv: kv[1]), module=__name__)


Status = _from_c("Status", "pi_status", "PI_")
Type = _from_c("Type", "pi_type", "PI_TYPE_")
RopeType = _from_c("RopeType", "pi_rope_type", "PI_ROPE_")
Act = _from_c("Act", "pi_act", "PI_ACT_")
#: per-layer tensor slots in pi_model_params.layers order; ``COUNT`` is their number
LayerSlot = _from_c("LayerSlot", "pi_layer_slot", "PI_L_")
FfnThresholdOn = _from_c("FfnThresholdOn", "pi_ffn_threshold_on", "PI_FFN_ON_")
#: sparse FFN forms (``enum pi_ffn_act``): SWIGLU, GEGLU, RELU, DRELU, RELU_UP, GELU_UP
FfnForm = _from_c("FfnForm", "pi_ffn_act", "PI_FFN_")
#: bits of pi_isa_supported()
IsaBit = _from_c("IsaBit", "pi_isa_bit", "PI_ISA_")
#: op kinds of the per-op timer (``enum pi_prof_op``); ``COUNT`` is their number
ProfOp = _from_c("ProfOp", "pi_prof_op", "PI_PROF_")
