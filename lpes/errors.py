"""lpes.errors, the module's path before the foundation had a folder of its own: it is lpes.foundation.errors.

One module under two names (`from lpes.errors import ...` in a user's code keeps working); lpes itself
imports lpes.foundation.errors.
"""

import sys

from lpes.foundation import errors

sys.modules[__name__] = errors
