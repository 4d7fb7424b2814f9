"""The call as it travels to the ranks: the function and its arguments, pickled by value.

Introduced in notebooks/00_setup_and_launcher.ipynb (functions defined in a notebook cell run
on every rank).
"""

from __future__ import annotations

from labkit.launcher._backend_spec import BackendSpec


def dumps_by_value(obj) -> bytes:
    """cloudpickle, but code objects keep their file name.

    cloudpickle >= 3.1 renames every shipped function's file to ``<dynamic-code>``; keeping the
    real one (a notebook cell's ``/tmp/ipykernel_.../N.py``) lets the launcher show the source
    line of each frame in a rank's traceback and stack dump.
    """
    import importlib
    import io
    import pickle
    import sys
    import types
    from collections import ChainMap

    import cloudpickle

    base = cloudpickle.Pickler.dispatch_table.get(types.CodeType)
    if base is None:  # an older cloudpickle keeps file names by itself
        return cloudpickle.dumps(obj)

    def reduce_code(code):
        ctor, args = base(code)
        keep = code.co_filename
        return ctor, tuple(keep if a == "<dynamic-code>" else a for a in args)

    class _Pickler(cloudpickle.Pickler):
        dispatch_table = ChainMap({types.CodeType: reduce_code}, cloudpickle.Pickler.dispatch_table)

        def reducer_override(self, obj):
            # torch.backends.* are instances of module subclasses, which cloudpickle tries to
            # copy by value (and fails); any module that is in sys.modules goes by name.
            if isinstance(obj, types.ModuleType) and type(obj) is not types.ModuleType:
                name = getattr(obj, "__name__", None)
                if name and sys.modules.get(name) is obj:
                    return importlib.import_module, (name,)
            return super().reducer_override(obj)

    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def pickle_call(fn, args: tuple, kwargs: dict, carrier: str | BackendSpec = "gloo") -> bytes:
    """Serialise the call and its backend by value (works for lambdas and closures defined in
    a notebook, and for a BackendSpec whose creator is one); ``carrier`` is ``Plan.carrier``."""
    import cloudpickle

    try:
        return dumps_by_value((fn, args, kwargs, carrier))
    except Exception as exc:  # noqa: BLE001 - find the culprit for the message
        culprit = "fn (or something it uses from the notebook)"
        for i, a in enumerate(args):
            try:
                cloudpickle.dumps(a)
            except Exception:  # noqa: BLE001
                culprit = f"args[{i}] ({type(a).__name__})"
                break
        for k, v in kwargs.items():
            try:
                cloudpickle.dumps(v)
            except Exception:  # noqa: BLE001
                culprit = f"kwargs[{k!r}] ({type(v).__name__})"
                break
        raise ValueError(
            f"{culprit} cannot be sent to the ranks: {type(exc).__name__}: {exc}. Ranks are "
            "separate processes; pass plain data, or create the object inside fn."
        ) from exc
