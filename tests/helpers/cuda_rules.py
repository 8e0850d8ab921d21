"""CUDA's rules, checked on a machine without a GPU.

A CPU kernel often takes what its CUDA twin refuses (torch's CPU `_scaled_mm` takes any size; CUDA's wants multiples
of 16). torch states the CUDA rules in its meta kernels (`torch/_meta_registrations.py`), which run for tensors that a
`FakeTensorMode` places on "cuda", with no GPU and no CUDA build. Two ways in:

- `fake_cuda()`: a FakeTensorMode in which `device="cuda"` tensors are fakes; forward passes and backward ops called
  directly run CUDA's shape and dtype checks. (Autograd's engine on fake CUDA leaves needs a CUDA build.)
- `ScaledMatmuls`: records every `torch._scaled_mm` a real CPU run makes (the shapes, strides and dtypes it got) and
  replays each on fake CUDA tensors, where CUDA's checks say which calls a GPU would refuse.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map_only


def fake_cuda() -> FakeTensorMode:
    """Tensors made with device="cuda" inside are fakes that run CUDA's meta kernels."""
    return FakeTensorMode(allow_non_fake_inputs=False)


@dataclass(frozen=True)
class Operand:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, tensor: torch.Tensor) -> Operand:
        return cls(tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)

    def on_fake_cuda(self) -> torch.Tensor:
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device="cuda")


@dataclass(frozen=True)
class ScaledMatmul:
    """One `torch._scaled_mm(a, b, scale_a=..., scale_b=..., ...)` call as a CPU run made it: every tensor argument
    as an `Operand`, the rest as given."""

    args: tuple
    kwargs: dict

    def cuda_refusal(self) -> str | None:
        """CUDA's error for this call (from its meta kernel), or None where a GPU takes it."""
        fake_log = logging.getLogger("torch._subclasses.fake_tensor")
        level = fake_log.level
        fake_log.setLevel(logging.CRITICAL)  # it logs each refusal with a traceback; the refusal is the answer here
        try:
            with fake_cuda():
                args, kwargs = tree_map_only(Operand, Operand.on_fake_cuda, (self.args, self.kwargs))
                torch._scaled_mm(*args, **kwargs)
        except RuntimeError as error:
            return str(error).splitlines()[0]
        finally:
            fake_log.setLevel(level)
        return None

    def __str__(self) -> str:
        return f"{self.args[0].shape} @ {self.args[1].shape}"


class ScaledMatmuls(contextlib.AbstractContextManager):
    """`with ScaledMatmuls() as calls:` records every torch._scaled_mm made inside (torchao reaches the kernel
    through the `torch._scaled_mm` attribute) and still runs it; `calls.refused()`: those CUDA would refuse."""

    def __init__(self):
        self.calls: list[ScaledMatmul] = []
        self._real = torch._scaled_mm
        self._patch = mock.patch("torch._scaled_mm", self._record)

    def _record(self, *args, **kwargs):
        self.calls.append(ScaledMatmul(*tree_map_only(torch.Tensor, Operand.of, (args, kwargs))))
        return self._real(*args, **kwargs)

    def __enter__(self) -> ScaledMatmuls:
        self._patch.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._patch.__exit__(*exc)

    def refused(self) -> list[tuple[str, str]]:
        return [(str(call), reason) for call in self.calls if (reason := call.cuda_refusal()) is not None]
