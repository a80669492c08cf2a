"""python -m lpes.exporters.tensorrt ONNX_DIR OUT_DIR --dtype D [profile flags]: build an engine on this machine."""

import sys

from lpes.exporters.tensorrt.engine import main

sys.exit(main())
