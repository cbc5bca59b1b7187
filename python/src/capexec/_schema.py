"""The wire schema, loaded once from the copy inside the package.

This module is the package's untyped boundary with pycapnp: `schema` is the
loaded module (its structs, enums and interfaces), typed `Any`. Everything
else reaches pycapnp through here or through the few helpers in `_rpc`.
"""

from __future__ import annotations

import os
from typing import Any

import capnp  # type: ignore[import-untyped]

_HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA_PATH = os.path.join(_HERE, "schema", "capexec.capnp")

# pycapnp ships /capnp/stream.capnp (and c++.capnp) inside its own package:
# the schema's `import "/capnp/..."` resolve against that package's parent.
_INCLUDES = [os.path.dirname(os.path.dirname(os.path.abspath(capnp.__file__)))]

schema: Any = capnp.load(SCHEMA_PATH, imports=_INCLUDES)
SCHEMA: Any = schema
