"""The node agent: runs on every compute node, registers and heart-beats, long-polls its node's
work, starts one process per local rank with its environment, reports starts and exits.

Django-free (an import-linter contract checks it); it speaks only the REST API.
Run it as `python -m apps.agent --server URL --node NAME --token-file F`.
"""

VERSION = "1.0.0"
