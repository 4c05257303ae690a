"""The user CLI (`python -m apps.cli`): submit, status, queue, cancel, logs, rankmap, nodes,
drain, resume over the REST API. Django-free (an import-linter contract checks it).

Exit codes: 0 done, 1 the job failed or was cancelled, 2 usage or a request the server
refused as invalid, 3 the server could not be reached or refused the credentials.
"""
