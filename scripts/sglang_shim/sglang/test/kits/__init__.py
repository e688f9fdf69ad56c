"""sglang.test.kits: SGLang's test mixins, read from the folder of SGLang's test files.

The kits are SGLang's test code (python/sglang/test/kits in its repository), so they are not
here: the runner passes the folder holding them as SGL_LITE_SGLANG_KITS, and this package's
search path points there.
"""

import os

__path__ = [p for p in [os.environ.get("SGL_LITE_SGLANG_KITS")] if p]
