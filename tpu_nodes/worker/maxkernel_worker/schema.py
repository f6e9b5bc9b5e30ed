"""The Cap'n Proto schemas (messages/schema/*.capnp), loaded with pycapnp."""

import os
import types

import capnp

# `import "/capnp/c++.capnp"` resolves against an import directory that holds capnp/c++.capnp:
# pycapnp bundles it in its package directory, so its parent is the import path.
_BUNDLED_IMPORTS = os.path.dirname(os.path.dirname(capnp.__file__))


def load_schemas(schema_dir: str) -> types.SimpleNamespace:
    """Every struct and enum of every schema file, by name: KernelSpec, WorkerRequest, ...

    Also `modules`: file name without extension -> the pycapnp module, and
    `schema_version`: common.capnp's schemaVersion constant.
    """
    if not os.path.isdir(schema_dir):
        raise FileNotFoundError(f"schema directory {schema_dir} does not exist")
    names = sorted(f for f in os.listdir(schema_dir) if f.endswith(".capnp"))
    if not names:
        raise FileNotFoundError(f"no .capnp files in {schema_dir}")
    ns = types.SimpleNamespace(modules={})
    for name in names:
        path = os.path.join(schema_dir, name)
        module = capnp.load(path, imports=[_BUNDLED_IMPORTS, os.path.abspath(schema_dir)])
        ns.modules[name[:-len(".capnp")]] = module
        for attr in dir(module):
            if attr[:1].isupper():
                setattr(ns, attr, getattr(module, attr))
    ns.schema_version = int(ns.modules["common"].schemaVersion)
    return ns
