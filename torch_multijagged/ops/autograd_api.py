"""The autograd API on a result whose gradient its values or per-image pieces hold (NOTE [ Eager
values path ] in ``fastpath.py``, NOTE [ Pieces read directly ] in ``pieces.py``): such a
result's wrapper node is passed by the consumers that read those, so ``torch.autograd.grad(…,
inputs=y)``, ``backward(inputs=[y])``, ``retain_grad`` / ``grad`` (get and set), ``retains_grad``,
``register_hook``, ``grad_fn`` and ``output_nr`` are answered on the values or pieces instead, and
``detach_`` forgets them.
Entries of the values path's table (``FAST``), registered on import."""

from __future__ import annotations

import inspect

import torch

from .. import pieces as _pieces
from .fastpath import FAST, MJT, _DisableTF, own_values, result

__all__: list[str] = []


def _wrap_grad(g, like: MJT):
    """A gradient of ``like``'s values (or a wrapper of them) as a gradient of ``like``."""
    if g is None:
        return None
    return result(g._values if isinstance(g, MJT) else g, like._partition, like._ragged_dims)


def _autograd_grad(outputs, inputs, *args, **kwargs):
    single = isinstance(inputs, torch.Tensor)
    ins = (inputs,) if single else tuple(inputs)
    owned = [own_values(t) for t in ins]
    held = [_pieces.read_directly(t) if o is None else None for t, o in zip(ins, owned)]
    if any(h is not None for h in held):
        return _grad_of_pieces(outputs, ins, owned, held, args, kwargs)
    if all(o is None for o in owned):
        return NotImplemented
    new = tuple(t if o is None else o for t, o in zip(ins, owned))
    with _DisableTF():
        grads = torch.autograd.grad(outputs, new[0] if single else new, *args, **kwargs)
    return tuple(g if o is None else _wrap_grad(g, t) for g, t, o in zip(grads, ins, owned))


_GRAD_SIGNATURE = inspect.signature(torch.autograd.grad)


def _grad_of_pieces(outputs, ins, owned, held, args, kwargs):
    """``torch.autograd.grad`` where some inputs were read image by image (NOTE [ Pieces read
    directly ] in ``pieces.py``): their pieces are asked instead, and the answers put together."""
    bound = _GRAD_SIGNATURE.bind(outputs, ins, *args, **kwargs)
    bound.apply_defaults()
    opts = dict(bound.arguments)
    if opts["is_grads_batched"]:
        raise NotImplementedError("torch.autograd.grad(): is_grads_batched with a multi_jagged input held as "
                                  "per-image pieces is not supported")
    materialize = opts["materialize_grads"]
    allow_unused = opts["allow_unused"] if opts["allow_unused"] is not None else materialize
    flat, spans = [], []
    for t, o, h in zip(ins, owned, held):
        parts = h if h is not None else [t if o is None else o]
        spans.append((len(flat), len(parts)))
        flat.extend(parts)
    opts.update(inputs=flat, allow_unused=True, materialize_grads=False)
    with _DisableTF():
        grads = torch.autograd.grad(**opts)
    out = []
    for t, o, h, (start, n) in zip(ins, owned, held, spans):
        gs = grads[start:start + n]
        if h is not None:
            g = _pieces.gradient_from(t, h, gs)
        elif o is not None:
            g = _wrap_grad(gs[0], t)
        else:
            g = gs[0]
        if g is None:
            if materialize:
                g = torch.zeros_like(t)
            elif not allow_unused:
                raise RuntimeError("One of the differentiated Tensors appears to not have been used in the graph. "
                                   "Set allow_unused=True if this is the desired behavior.")
        out.append(g)
    return tuple(out)


def _autograd_backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None,
                       inputs=None):
    """``torch.autograd.backward(…, inputs=…)`` (``Tensor.backward`` comes here too) where an input
    is a values-path result or was read image by image: its gradient accumulates into its values'
    or pieces' ``.grad``, which its own ``.grad`` then reads (as after ``retain_grad``). Its
    wrapper's node never runs for the consumers that read those, so accumulating into the
    wrapper would leave its ``.grad`` None."""
    if inputs is None:
        return NotImplemented
    ins = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs.values() if isinstance(inputs, dict) else inputs)
    subs, changed = [], False
    for t in ins:
        v = own_values(t)
        if v is not None:
            t.__dict__["_retained"] = v
            subs.append(v)
            changed = True
            continue
        held = _pieces.read_directly(t)
        if held is not None:
            t.__dict__["_retained_pieces"] = held
            subs.extend(held)
            changed = True
            continue
        subs.append(t)
    if not changed:
        return NotImplemented
    with _DisableTF():
        torch.autograd.backward(tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs=tuple(subs))
    return None


def _retain_grad(self):
    v = own_values(self)
    if v is None:
        held = _pieces.read_directly(self)
        if held is None:
            return NotImplemented
        for p in held:
            p.retain_grad()
        self.__dict__["_retained_pieces"] = held
        self.__dict__["_retains_grad"] = True
        return None
    v.retain_grad()
    self.__dict__["_retained"] = v
    self.__dict__["_retains_grad"] = True
    return None


def _retains_grad_get(self):
    """True after ``retain_grad`` answered on the values or pieces (the wrapper's own flag is
    never set there)."""
    return True if self.__dict__.get("_retains_grad") else NotImplemented


def _grad_get(self):
    held = self.__dict__.get("_retained_pieces")
    if held is not None:
        return _pieces.gradient_from(self, held, [p.grad for p in held])
    v = self.__dict__.get("_retained")
    if v is None:
        return NotImplemented
    return _wrap_grad(v.grad, self)


def _register_hook(self, hook):
    v = own_values(self)
    if v is None:
        held = _pieces.read_directly(self)
        return NotImplemented if held is None else _pieces.register_hook(self, held, hook)

    def on_values(g):
        r = hook(MJT(g, self._partition, self._ragged_dims))
        if r is None:
            return None
        if not (isinstance(r, MJT) and r._ragged_dims == self._ragged_dims and r._partition.same_as(self._partition)
                and r._values.shape == g.shape):
            # dense torch's refusal (as for this hook on a leaf): another structure's rows, or a
            # dense tensor of the values' shape, would be taken sample by sample as they lie
            raise RuntimeError(f"hook '{getattr(hook, '__name__', hook)}' has changed the size of value")
        return r._values

    return v.register_hook(on_values)


def _grad_fn_get(self):
    """A values-path result's node is its values' (``_register_hook``, above): its own wrapper-level
    node is passed by every op that reads the values, and never runs. Code that waits for a
    tensor's node to run (``torch.autograd.graph.register_multi_grad_hook``) then waits for the
    node that does. A result read image by image answers with its first image's node."""
    v = own_values(self)
    if v is None:
        held = _pieces.read_directly(self)
        return NotImplemented if held is None else held[0].grad_fn
    return v.grad_fn


def _grad_set(self, value):
    """``y.grad = g`` (``None`` too) for a ``y`` whose gradient its values or pieces hold
    (``retain_grad``, ``backward(inputs=[y])``): theirs is set, which ``y.grad`` reads."""
    v = self.__dict__.get("_retained")
    held = self.__dict__.get("_retained_pieces")
    if v is None and held is None:
        return NotImplemented
    if value is not None and not (isinstance(value, MJT) and value._partition is self._partition
                                  and value._ragged_dims == self._ragged_dims):
        return NotImplemented  # the general path sets it, or refuses it as dense torch does
    with torch.no_grad():
        if v is not None:
            v.grad = None if value is None else value._values
        else:
            parts = [None] * len(held) if value is None else [p for p in _pieces.split(value) if p is not None]
            for p, g in zip(held, parts):
                p.grad = None if g is None else g.detach().reshape(p.shape)
    return NotImplemented  # the wrapper's own field too


def _output_nr(self):
    """The output number of a values-path result is its values' (its node is theirs:
    ``_grad_fn_get``), so that ``torch.autograd.graph.get_gradient_edge(y)`` names the edge its
    gradient flows along. A result read image by image has one edge per image, which no single
    ``GradientEdge`` stands for: refused."""
    v = own_values(self)
    if v is not None:
        return v.output_nr
    held = _pieces.read_directly(self)
    if held is None:
        return NotImplemented
    raise RuntimeError(
        "output_nr: this multi_jagged tensor holds its images one by one and other ops already read "
        "them, so its gradient flows along one edge per image and no single GradientEdge names it; "
        "use torch.autograd.grad(..., inputs=tensor) instead"
    )


def _data_get(self):
    """``x.data``: the values' ``.data`` — their storage with a version counter of its own, as
    dense ``.data`` — so that a write through it (``x.data.mul_(2)``, an old-style update) is not
    seen by autograd, as in dense; the aten ``detach`` that the getter runs otherwise shares the
    values' counter, and a backward that saved them refused to run."""
    out = MJT(self._values.data, self._partition, self._ragged_dims)
    out.__dict__["_data_alias"] = True  # its writes are no writes of ``self`` (writes.py)
    return out


def _forget_history(x: MJT) -> None:
    """Drop what the values path remembered of ``x``'s history: the graph-carrying values, pieces
    read directly, a retained gradient."""
    for key in ("_vgraph", "_own_pieces", "_retained", "_retained_pieces"):
        x.__dict__.pop(key, None)


def _detach_(self):
    """``y.detach_()``: ``y`` becomes a leaf, as dense. What the values path remembered of its
    history goes with it: the graph-carrying values (whose gradient reached ``y``'s inputs after
    ``requires_grad_()``), pieces read directly, and a retained gradient."""
    _forget_history(self)
    return NotImplemented  # the wrapper's own detach_ follows


def _data_set(self, value):
    """``x.data = value`` (an old-style update, ``p.data = new``): ``x`` holds ``value``'s values
    from now on, as dense — unseen by autograd, ``x``'s identity, ``requires_grad`` and ``grad`` kept.
    ``value`` must be a multi_jagged tensor of ``x``'s structure, dtype, device and strides (the
    wrapper's own sizes and strides stay); otherwise it raises rather than keep the old values."""
    v = value._values if isinstance(value, MJT) else None
    if v is None or not (value._ragged_dims == self._ragged_dims and value._partition.same_as(self._partition)
                         and v.shape == self._values.shape and v.stride() == self._values.stride()
                         and v.dtype == self.dtype and v.device == self.device):
        what = f"a {type(value).__name__}" if not isinstance(value, MJT) else f"{tuple(value.shape)} {value.dtype}"
        raise RuntimeError(
            f"data: assigning {what} to the .data of a multi_jagged tensor {tuple(self.shape)} {self.dtype} takes "
            "a multi_jagged tensor of the same samples, dtype, device and strides; copy into it instead "
            "(with torch.no_grad(): x.copy_(value)) or build a new tensor"
        )
    _forget_history(self)
    self.__dict__["_values"] = v.detach()
    return None


FAST[torch.autograd.grad] = _autograd_grad
FAST[torch.Tensor.data.__set__] = _data_set
FAST[torch.Tensor.detach_] = FAST[torch.detach_] = _detach_
FAST[torch.Tensor.data.__get__] = _data_get
FAST[torch.Tensor.grad.__set__] = _grad_set
FAST[torch.Tensor.retains_grad.__get__] = _retains_grad_get
FAST[torch.Tensor.output_nr.__get__] = _output_nr
FAST[torch.autograd.backward] = _autograd_backward
FAST[torch.Tensor.grad_fn.__get__] = _grad_fn_get
FAST[torch.Tensor.retain_grad] = _retain_grad
FAST[torch.Tensor.grad.__get__] = _grad_get
FAST[torch.Tensor.register_hook] = _register_hook
