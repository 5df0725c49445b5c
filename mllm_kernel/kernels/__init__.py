"""The kernels: each folder kernels/<op>/ holds one op's C++ and CUDA sources and its Python
wrapper, importable as mllm_kernel.kernels.<op>.<op>. The wheel ships the folders inside this
package; in a checkout (and in Bazel's runfiles) they live in <repo>/kernels, which joins this
package's search path here. The JIT runtime finds kernel sources through the same path."""

import os

_checkout_kernels = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "kernels")
if os.path.isdir(_checkout_kernels) and _checkout_kernels not in __path__:
    __path__.append(_checkout_kernels)


def names() -> list[str]:
    """The kernel folders on this package's path (each holds <name>/<name>.py). pkgutil does not
    list them: they are namespace packages, without __init__.py."""
    found = []
    for root in __path__:
        if os.path.isdir(root):
            found += [n for n in sorted(os.listdir(root)) if os.path.isfile(os.path.join(root, n, n + ".py"))]
    return list(dict.fromkeys(found))
