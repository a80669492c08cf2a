"""lpes.spec, the module's path before the foundation had a folder of its own: it is lpes.foundation.spec.

One module under two names (`from lpes.spec import ...` in a user's code keeps working); lpes itself
imports lpes.foundation.spec.
"""

import sys

from lpes.foundation import spec

sys.modules[__name__] = spec
