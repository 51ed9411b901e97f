"""Griffe extensions for the API reference (mkdocs.yml).

* A compiled class whose ``__init__`` is a slot without a signature, but
  which advertises one through ``__signature__`` (``lmdbio.Environment``,
  ``Transaction``, ``Cursor``), gets that signature's parameters on its
  ``__init__``, so the reference shows and checks them.
* The docstrings' reStructuredText roles (``:class:`X```, ``:py:meth:`x```,
  for ``help()`` readers) become Markdown code spans.
"""

import inspect
import re

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|exc|obj):`~?([^`]+)`")


class SignatureFromRuntime(griffe.Extension):
    def on_instance(self, *, node, obj, agent, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(r"`\1`", obj.docstring.value)

    def on_class_members(self, *, node, cls, agent, **kwargs):
        obj = getattr(node, "obj", None)        # only under inspection
        if not isinstance(obj, type) or "__signature__" not in vars(obj):
            return
        init = cls.members.get("__init__")
        if init is None:
            return
        params = [griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword)]
        for p in inspect.signature(obj).parameters.values():
            params.append(griffe.Parameter(
                p.name, kind=griffe.ParameterKind(p.kind.description),
                default=None if p.default is p.empty else repr(p.default)))
        init.parameters = griffe.Parameters(*params)
